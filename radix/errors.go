package radix

import "errors"

// ErrConfig reports a tree configuration that cannot work.
var ErrConfig = errors.New("invalid radix tree configuration")

// ErrNode reports an operation on a node that does not allow it: a node that left
// the tree, the root, or a node in the wrong tier.
var ErrNode = errors.New("invalid radix node operation")

// ErrPages reports a page list whose length does not match the pages it describes.
var ErrPages = errors.New("page list does not match the key")

// ErrLocked reports unlocking a node that holds no lock.
var ErrLocked = errors.New("lock count underflow")

// ErrFull reports an insert larger than the free pages of the tree's token arena.
var ErrFull = errors.New("radix tree is full")
