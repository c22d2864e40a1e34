package wire

import (
	"errors"
	"fmt"
)

var (
	// ErrMalformed: a frame or message breaks the protocol: bad magic, a protocol
	// version other than Version, an unknown message type, a truncated frame, a
	// body over MaxBody, bad protobuf, a field out of range, file descriptors
	// where none belong. Sent messages are checked by the same rules.
	ErrMalformed = errors.New("malformed message")
	// ErrClosed: the connection was closed by this side (Conn.Close), or an earlier
	// failed send left it unusable.
	ErrClosed = errors.New("connection closed")
	// ErrInUse: Listen found a service already listening on the socket path.
	ErrInUse = errors.New("socket already in use")
	// ErrSocketPath: Listen cannot make its socket at the path given (a
	// read-only or foreign directory, a path too long, a file in the way):
	// the same start fails the same way until the path changes.
	ErrSocketPath = errors.New("cannot create the socket there")

	// errBadCount: a reader returned a byte count outside its buffer (negative,
	// or more than it was given), breaking io.Reader's contract. The frame
	// cannot be trusted, so it fails like an i/o error rather than panicking
	// on the slice the count would make.
	errBadCount = errors.New("reader returned a byte count outside its buffer")
)

// MessageError is what Recv and ReadFrame return for a frame they read whole but
// whose contents they rejected: an unknown message type, a body that does not
// decode or validate, wrong file descriptors. The stream is still in sync: a server
// can answer Error to Header.ID and go on reading. Any other receive error (bad
// magic or version, an oversize or truncated frame, an i/o error, a deadline in
// the middle of a frame) leaves the connection unusable. MessageError wraps
// ErrMalformed.
type MessageError struct {
	// Header is the header of the rejected frame.
	Header Header
	// Err says what was wrong; it wraps ErrMalformed.
	Err error
}

func (e *MessageError) Error() string {
	return fmt.Sprintf("%s frame (id %d): %v", e.Header.Type, e.Header.ID, e.Err)
}

func (e *MessageError) Unwrap() error { return e.Err }

// malformed returns an error wrapping ErrMalformed with the formatted text.
func malformed(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrMalformed)
}
