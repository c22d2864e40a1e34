package kvlayout

import "errors"

// ErrGeometry reports a geometry that does not describe a KV cache.
var ErrGeometry = errors.New("invalid KV geometry")

// ErrLayout reports an unknown layout or a layout that cannot hold the pool asked for.
var ErrLayout = errors.New("invalid KV layout")
