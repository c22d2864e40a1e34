package node

import "errors"

// ErrConfig reports a service configuration that cannot run.
var ErrConfig = errors.New("invalid node service configuration")

// ErrClosed reports use of a closed service.
var ErrClosed = errors.New("node service closed")

// errMemoryBusy reports a request that found the request memory budget full
// for as long as it could wait.
var errMemoryBusy = errors.New("request memory budget full")

// errHelloFirst reports a frame other than Hello from a connection that has
// not said Hello yet: its body is dropped unread into memory.
var errHelloFirst = errors.New("send Hello first")

// errFrameTooLarge reports a frame that is not a request (a Hello, a Ping, a
// registration) declaring a body longer than such a message takes: the
// service drops it rather than read it into memory it does not budget.
var errFrameTooLarge = errors.New("frame longer than its message takes")

// ErrShutdown reports a Close that ended with requests still running (stuck
// past the shutdown and request timeouts).
var ErrShutdown = errors.New("node service shut down with requests still running")

// errStarting reports a request that must wait for the arena's recovery
// (a remove) and found it still running when its deadline came.
var errStarting = errors.New("the node service is still recovering its arena file")
