package pagekey

import "errors"

// ErrConfig reports a Hasher configuration that cannot produce keys.
var ErrConfig = errors.New("invalid page key configuration")

// ErrTokens reports token input that is not a list of 32-bit unsigned token ids.
var ErrTokens = errors.New("invalid token ids")

// ErrKey reports text that is not a page key.
var ErrKey = errors.New("invalid page key")
