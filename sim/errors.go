package sim

import "errors"

// ErrConfig reports a bench configuration that cannot run.
var ErrConfig = errors.New("invalid bench configuration")
