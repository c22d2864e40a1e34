package wire

import (
	"errors"
	"strconv"
)

// Type is a message type, the fourth byte of a frame header. The numbers are part
// of the protocol (enum MessageType in strata.proto); new types get new numbers.
type Type uint8

// Message types. A request's reply type is Type.Reply; any request may instead be
// answered with TypeError.
const (
	// TypeHello opens a session: the client's protocol version, name and pid.
	TypeHello Type = 1
	// TypeHelloReply gives the client its id, the server's version and batch limit.
	TypeHelloReply Type = 2
	// TypeRegisterSegment hands the service a memfd segment (one fd with the frame).
	TypeRegisterSegment Type = 3
	// TypeRegisterSegmentReply gives the registered segment's id.
	TypeRegisterSegmentReply Type = 4
	// TypeUnregisterSegment releases a segment; the reply is TypeAck.
	TypeUnregisterSegment Type = 5
	// TypeExists asks how many keys, from the start, exist in a format.
	TypeExists Type = 6
	// TypeExistsReply answers TypeExists.
	TypeExistsReply Type = 7
	// TypePut writes objects from the client's segments.
	TypePut Type = 8
	// TypeGet reads objects into the client's segments.
	TypeGet Type = 9
	// TypeBatchReply has one Result per item of a TypePut or TypeGet.
	TypeBatchReply Type = 10
	// TypeRemove deletes objects.
	TypeRemove Type = 11
	// TypeRemoveReply says how many objects were removed.
	TypeRemoveReply Type = 12
	// TypeStats asks for the server's stats document.
	TypeStats Type = 13
	// TypeStatsReply carries the stats document (JSON).
	TypeStatsReply Type = 14
	// TypePing checks that the server is alive.
	TypePing Type = 15
	// TypePong answers TypePing with its nonce.
	TypePong Type = 16
	// TypeAck is an empty success reply.
	TypeAck Type = 17
	// TypeError is a whole-request failure.
	TypeError Type = 18

	maxType = TypeError
)

var typeNames = [...]string{
	TypeHello:                "Hello",
	TypeHelloReply:           "HelloReply",
	TypeRegisterSegment:      "RegisterSegment",
	TypeRegisterSegmentReply: "RegisterSegmentReply",
	TypeUnregisterSegment:    "UnregisterSegment",
	TypeExists:               "Exists",
	TypeExistsReply:          "ExistsReply",
	TypePut:                  "Put",
	TypeGet:                  "Get",
	TypeBatchReply:           "BatchReply",
	TypeRemove:               "Remove",
	TypeRemoveReply:          "RemoveReply",
	TypeStats:                "Stats",
	TypeStatsReply:           "StatsReply",
	TypePing:                 "Ping",
	TypePong:                 "Pong",
	TypeAck:                  "Ack",
	TypeError:                "Error",
}

// Valid reports whether t is a known message type.
func (t Type) Valid() bool { return t >= TypeHello && t <= maxType }

// String returns the message name ("Put"), or "Type(N)" for an unknown type.
func (t Type) String() string {
	if t.Valid() {
		return typeNames[t]
	}
	return "Type(" + strconv.Itoa(int(t)) + ")"
}

// Reply returns the type of a successful reply to request type t (TypeHelloReply
// for TypeHello, TypeBatchReply for TypePut and TypeGet, TypeAck for
// TypeUnregisterSegment), or 0 when t is not a request.
func (t Type) Reply() Type {
	switch t {
	case TypeHello:
		return TypeHelloReply
	case TypeRegisterSegment:
		return TypeRegisterSegmentReply
	case TypeUnregisterSegment:
		return TypeAck
	case TypeExists:
		return TypeExistsReply
	case TypePut, TypeGet:
		return TypeBatchReply
	case TypeRemove:
		return TypeRemoveReply
	case TypeStats:
		return TypeStatsReply
	case TypePing:
		return TypePong
	}
	return 0
}

// IsRequest reports whether t is sent by clients and answered by the server.
func (t Type) IsRequest() bool { return t.Reply() != 0 }

// Status is the outcome of one item of a batch (Result) or of a whole request
// (Error). The numbers are part of the protocol (enum Status in strata.proto); a
// new status comes only with a new protocol version, so decoders reject unknown
// values.
type Status uint8

// Statuses.
const (
	// OK: done.
	OK Status = 0
	// NotFound: the object does not exist (in that format: see FormatMismatch). A
	// miss, not a fault.
	NotFound Status = 1
	// Corrupt: the object failed its integrity check; it was not served.
	Corrupt Status = 2
	// NoSpace: the service has no room for the object, even after eviction.
	NoSpace Status = 3
	// BadRange: a range is not inside a segment this client registered: allocate
	// host pools with the shm allocator and register their segments. Or a Get's
	// item overlaps another item's memory (two copies into the same bytes).
	BadRange Status = 4
	// FormatMismatch: the object exists in another format (another layout or page
	// size); it was not served.
	FormatMismatch Status = 5
	// Busy: the service is overloaded (or the object is being written); retry later.
	Busy Status = 6
	// Quota: the client is over its share of the service's memory or requests.
	Quota Status = 7
	// Internal: a fault inside the service; the message says what.
	Internal Status = 8
	// Unavailable: the service cannot serve now (starting, draining, a tier down).
	Unavailable Status = 9

	maxStatus = Unavailable
)

var statusNames = [...]string{
	OK:             "ok",
	NotFound:       "not_found",
	Corrupt:        "corrupt",
	NoSpace:        "no_space",
	BadRange:       "bad_range",
	FormatMismatch: "format_mismatch",
	Busy:           "busy",
	Quota:          "quota",
	Internal:       "internal",
	Unavailable:    "unavailable",
}

var statusTexts = [...]string{
	OK:             "ok",
	NotFound:       "object not found",
	Corrupt:        "object corrupt",
	NoSpace:        "node service storage full",
	BadRange:       "range is not inside a segment this client registered",
	FormatMismatch: "object exists in another format",
	Busy:           "node service busy",
	Quota:          "client over its quota",
	Internal:       "node service internal error",
	Unavailable:    "node service unavailable",
}

// Valid reports whether s is a known status.
func (s Status) Valid() bool { return s <= maxStatus }

// String returns the status's name for logs and metrics ("not_found"), or
// "Status(N)" for an unknown status.
func (s Status) String() string {
	if s.Valid() {
		return statusNames[s]
	}
	return "Status(" + strconv.Itoa(int(s)) + ")"
}

// Error returns nil for OK and otherwise an error for s. Errors of equal statuses
// are equal, so callers test errors.Is(err, wire.NotFound.Error()); StatusOf
// recovers the status from a wrapped error.
func (s Status) Error() error {
	if s == OK {
		return nil
	}
	return statusError(s)
}

// statusError is the error form of a non-OK Status; comparable, so errors.Is
// matches equal statuses.
type statusError Status

func (e statusError) Error() string {
	if s := Status(e); s.Valid() {
		return statusTexts[s]
	}
	return "node service status " + strconv.Itoa(int(e))
}

// StatusOf returns the Status that err carries (an error made by Status.Error,
// Result.Err or Error.Err, possibly wrapped): OK for nil, Internal for an error
// that carries no status.
func StatusOf(err error) Status {
	if err == nil {
		return OK
	}
	var se statusError
	if errors.As(err, &se) {
		return Status(se)
	}
	return Internal
}
