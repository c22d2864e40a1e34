package workload

import "errors"

// ErrConfig reports a workload configuration that cannot produce a trace, or a
// workload name that is not known.
var ErrConfig = errors.New("invalid workload configuration")
