package main

import "errors"

// The ways a size is refused (units.go); callers test with errors.Is.
var (
	// errSizeSyntax: not a number with a unit strata knows.
	errSizeSyntax = errors.New("not a size")
	// errSizeUnit: a unit that means 1000 to some and 1024 to others (G, GB).
	errSizeUnit = errors.New("ambiguous size unit")
	// errSizeFraction: a size that is no whole number of bytes.
	errSizeFraction = errors.New("size is not a whole number of bytes")
)

// sizeError is a refused size: its message says what to write instead, its
// kind is one of the errSize sentinels.
type sizeError struct {
	msg  string
	kind error
}

func (e *sizeError) Error() string { return e.msg }
func (e *sizeError) Unwrap() error { return e.kind }
