package wire

import (
	"math"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
)

// Decode decodes and validates the body of a frame of type t. It returns a pointer
// to the concrete message (*Hello, *Put, ...). Malformed input, of any kind, is an
// error wrapping ErrMalformed; Decode never panics. Strings and bytes in the
// message are copies: body may be reused once Decode returns.
//
// Like any protobuf decoder it skips fields it does not know (so a newer peer can
// add fields) and lets the last of repeated scalar fields win, but it rejects a
// known field of the wrong wire type, groups, enum values it does not know and
// integers out of their field's range.
func Decode(t Type, body []byte) (Message, error) {
	if !t.Valid() {
		return nil, malformed("unknown message type %d (known: %d to %d)", uint8(t), TypeHello, maxType)
	}
	if len(body) > MaxBody {
		return nil, malformed("%s body of %d bytes, at most %d", t, len(body), MaxBody)
	}
	m := newMessage(t)
	if err := m.(unmarshaler).unmarshal(body); err != nil {
		return nil, prefix(t.String(), err)
	}
	if err := m.Validate(); err != nil {
		return nil, prefix(t.String(), err)
	}
	return m, nil
}

type unmarshaler interface{ unmarshal(b []byte) error }

// prefix puts what in front of err's text, keeping it wrapped.
func prefix(what string, err error) error { return &prefixed{what, err} }

type prefixed struct {
	what string
	err  error
}

func (p *prefixed) Error() string { return p.what + ": " + p.err.Error() }
func (p *prefixed) Unwrap() error { return p.err }

// fields walks the fields of one encoded protobuf message.
type fields struct {
	b   []byte
	num protowire.Number
	typ protowire.Type
	v   uint64 // the value of a varint, fixed32 or fixed64 field
	val []byte // the contents of a length-delimited field
}

// next reads the next field; false at the end of the message.
func (f *fields) next() (bool, error) {
	if len(f.b) == 0 {
		return false, nil
	}
	num, typ, n := protowire.ConsumeTag(f.b)
	if n < 0 {
		return false, malformed("bad field tag: %v", protowire.ParseError(n))
	}
	f.b = f.b[n:]
	f.num, f.typ, f.val = num, typ, nil
	switch typ {
	case protowire.VarintType:
		f.v, n = protowire.ConsumeVarint(f.b)
	case protowire.Fixed32Type:
		var v uint32
		v, n = protowire.ConsumeFixed32(f.b)
		f.v = uint64(v)
	case protowire.Fixed64Type:
		f.v, n = protowire.ConsumeFixed64(f.b)
	case protowire.BytesType:
		f.val, n = protowire.ConsumeBytes(f.b)
	default:
		return false, malformed("field %d has wire type %d; groups and reserved wire types are not used", num, typ)
	}
	if n < 0 {
		return false, malformed("field %d: %v", num, protowire.ParseError(n))
	}
	f.b = f.b[n:]
	return true, nil
}

// want checks that the current field, called name, has wire type typ.
func (f *fields) want(name string, typ protowire.Type) error {
	if f.typ != typ {
		return malformed("field %d (%s) has wire type %d, want %d", f.num, name, f.typ, typ)
	}
	return nil
}

func (f *fields) varint(name string) (uint64, error) {
	return f.v, f.want(name, protowire.VarintType)
}

func (f *fields) uint32(name string) (uint32, error) {
	if err := f.want(name, protowire.VarintType); err != nil {
		return 0, err
	}
	if f.v > math.MaxUint32 {
		return 0, malformed("%s %d out of range (uint32)", name, f.v)
	}
	return uint32(f.v), nil
}

func (f *fields) int32(name string) (int32, error) {
	if err := f.want(name, protowire.VarintType); err != nil {
		return 0, err
	}
	v := int64(f.v)
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, malformed("%s %d out of range (int32)", name, v)
	}
	return int32(v), nil
}

func (f *fields) bool(name string) (bool, error) {
	if err := f.want(name, protowire.VarintType); err != nil {
		return false, err
	}
	if f.v > 1 {
		return false, malformed("%s %d, want 0 or 1", name, f.v)
	}
	return f.v == 1, nil
}

func (f *fields) fixed64(name string) (uint64, error) {
	return f.v, f.want(name, protowire.Fixed64Type)
}

func (f *fields) status(name string) (Status, error) {
	if err := f.want(name, protowire.VarintType); err != nil {
		return 0, err
	}
	if f.v > uint64(maxStatus) {
		return 0, malformed("%s %d is not a known status (0 to %d)", name, f.v, maxStatus)
	}
	return Status(f.v), nil
}

// string returns the field's contents as a new string. The length limit is checked
// here, before the copy; UTF-8 and syntax are checked by Validate.
func (f *fields) string(name string, max int) (string, error) {
	if err := f.want(name, protowire.BytesType); err != nil {
		return "", err
	}
	if len(f.val) > max {
		return "", malformed("%s is %d bytes, at most %d", name, len(f.val), max)
	}
	return string(f.val), nil
}

// count returns how many fields numbered num the message b has, at most limit; more
// is an error. It sizes slices before they are filled, so that a hostile count
// costs no allocation.
func count(b []byte, num protowire.Number, name string, limit int) (int, error) {
	f := fields{b: b}
	n := 0
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return n, err
		}
		if f.num == num {
			if n++; n > limit {
				return 0, malformed("more than %d %s", limit, name)
			}
		}
	}
}

// skipAll checks that b is well-formed protobuf and ignores its fields: the
// decoder of empty messages (Stats, Ack), which a newer peer may extend.
func skipAll(b []byte) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
	}
}

func prefixIndex(what string, i int, err error) error {
	return prefix(what+"["+strconv.Itoa(i)+"]", err)
}
