package wire

import (
	"math"
	"strconv"
	"strings"

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

func (m *Hello) unmarshal(b []byte) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		switch f.num {
		case fHelloVersion:
			m.Version, err = f.uint32("version")
		case fHelloClientName:
			m.ClientName, err = f.string("client name", MaxName)
		case fHelloPID:
			m.PID, err = f.int32("pid")
		}
		if err != nil {
			return err
		}
	}
}

func (m *HelloReply) unmarshal(b []byte) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		switch f.num {
		case fHelloReplyClientID:
			m.ClientID, err = f.varint("client id")
		case fHelloReplyServerVersion:
			m.ServerVersion, err = f.string("server version", MaxName)
		case fHelloReplyMaxBatch:
			m.MaxBatch, err = f.uint32("max batch")
		case fHelloReplyClockNS:
			m.ClockNS, err = f.varint("clock")
		case fHelloReplyInstanceID:
			m.InstanceID, err = f.fixed64("instance id")
		case fHelloReplyContentID:
			m.ContentID, err = f.fixed64("content id")
		case fHelloReplyStarting:
			m.Starting, err = f.bool("starting")
		case fHelloReplyReadyPercent:
			m.ReadyPercent, err = f.uint32("ready percent") // the last one wins; Validate checks it
		case fHelloReplyWarm:
			m.Warm, err = f.bool("warm")
		}
		if err != nil {
			return err
		}
	}
}

func (m *RegisterSegment) unmarshal(b []byte) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		switch f.num {
		case fRegisterSize:
			m.Size, err = f.varint("size")
		case fRegisterName:
			m.Name, err = f.string("name", MaxName)
		case fRegisterFence:
			var v uint64
			v, err = f.varint("fence")
			if err == nil && v > 1 {
				err = malformed("fence %d, want 0 or 1", v)
			}
			m.Fence = v == 1
		}
		if err != nil {
			return err
		}
	}
}

func unmarshalSegmentID(b []byte, id *uint32) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		if f.num == fSegmentID {
			if *id, err = f.uint32("segment id"); err != nil {
				return err
			}
		}
	}
}

func (m *RegisterSegmentReply) unmarshal(b []byte) error {
	return unmarshalSegmentID(b, &m.SegmentID)
}

func (m *UnregisterSegment) unmarshal(b []byte) error {
	return unmarshalSegmentID(b, &m.SegmentID)
}

// unmarshalKeys collects the keys (field num) of b; other fields go to other.
func unmarshalKeys(b []byte, num protowire.Number, other func(f *fields) error) ([]string, error) {
	n, err := count(b, num, "keys", MaxItems)
	if err != nil || n == 0 && other == nil {
		return nil, err
	}
	var keys []string
	if n > 0 {
		keys = make([]string, 0, n)
	}
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return keys, err
		}
		if f.num == num {
			k, err := f.string("key", MaxKey)
			if err != nil {
				return nil, prefixIndex("keys", len(keys), err)
			}
			keys = append(keys, k)
		} else if other != nil {
			if err := other(&f); err != nil {
				return nil, err
			}
		}
	}
}

func (m *Exists) unmarshal(b []byte) (err error) {
	m.Keys, err = unmarshalKeys(b, fExistsKeys, func(f *fields) (err error) {
		if f.num == fExistsFormat {
			m.Format, err = f.fixed64("format")
		}
		return err
	})
	return err
}

func (m *ExistsReply) unmarshal(b []byte) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		if f.num == fExistsReplyPresent {
			if m.Present, err = f.uint32("present"); err != nil {
				return err
			}
		}
	}
}

func (r *Range) unmarshal(b []byte) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		switch f.num {
		case fRangeSegment:
			r.Segment, err = f.uint32("segment")
		case fRangeOffset:
			r.Offset, err = f.varint("offset")
		case fRangeLength:
			r.Length, err = f.varint("length")
		}
		if err != nil {
			return err
		}
	}
}

// unmarshal decodes an item. Its ranges are appended to room[:0], which has space
// for all of them (they were counted beforehand), so they cost no allocation.
func (it *Item) unmarshal(b []byte, room []Range, keys *keyBuffer) error {
	it.Ranges = room[:0]
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		switch f.num {
		case fItemKey:
			if keys != nil {
				it.Key, err = keys.string(&f, "key", MaxKey)
			} else {
				it.Key, err = f.string("key", MaxKey)
			}
		case fItemFormat:
			it.Format, err = f.fixed64("format")
		case fItemRanges:
			if err = f.want("ranges", protowire.BytesType); err == nil {
				i := len(it.Ranges)
				it.Ranges = append(it.Ranges, Range{})
				if err = it.Ranges[i].unmarshal(f.val); err != nil {
					err = prefixIndex("ranges", i, err)
				}
			}
		}
		if err != nil {
			return err
		}
	}
	n := len(it.Ranges)
	it.Ranges = it.Ranges[:n:n] // an append by the caller must not run into the next item's ranges
	if n == 0 {
		it.Ranges = nil
	}
	return nil
}

// The items of a Put or Get are decoded in two passes. A first one counts the
// items (bounded by MaxItems), so that the items fill one slice allocated once,
// and their ranges another, sized for the common one range an item (an item
// with more grows its own; MaxRanges bounds them as it is decoded). With
// shareKeys the keys are copied into one buffer, each key a slice of it: one
// allocation instead of one per item, which a batch of small objects pays for in
// full. A key then keeps its batch's keys alive, so only a Get does so (its
// keys are looked up; the service copies the few it keeps, those of objects it
// promotes); a Put's keys are stored, and each gets its own string.
// Allocations stay bounded by the body's length, which MaxBody bounds.
//
// unmarshalBatch decodes a Put or Get: its items (as above), its deadline and
// its fence slot. Encoders write the deadline and the slot first, each with
// its one-byte tag; the fast path takes them off there, and the general walk
// finds them anywhere.
func unmarshalBatch(b []byte, shareKeys bool) (items []Item, deadline uint64, slot uint32, err error) {
	rest, deadline, slot, ok := takeWindow(b)
	var n int
	canonical := false
	if ok {
		n, canonical = countCanonical(rest, MaxItems)
	}
	if canonical {
		b = rest
	} else {
		if n, err = count(b, fBatchItems, "items", MaxItems); err != nil {
			return nil, 0, 0, err
		}
		if deadline, slot, err = windowFields(b); err != nil {
			return nil, 0, 0, err
		}
	}
	items, err = decodeItems(b, n, canonical, shareKeys)
	return items, deadline, slot, err
}

// Tags of a batch's deadline and fence slot as the encoders write them.
const (
	tagBatchDeadline = byte(fBatchDeadlineNS)<<3 | byte(protowire.VarintType)
	tagBatchSlot     = byte(fBatchFenceSlot)<<3 | byte(protowire.VarintType)
)

// takeWindow takes a leading deadline and fence slot, as the encoders write
// them, off b; ok false leaves b whole to the general walk.
func takeWindow(b []byte) (rest []byte, deadline uint64, slot uint32, ok bool) {
	rest = b
	if len(rest) > 0 && rest[0] == tagBatchDeadline {
		v, k := protowire.ConsumeVarint(rest[1:])
		if k < 0 {
			return b, 0, 0, false
		}
		deadline, rest = v, rest[1+k:]
	}
	if len(rest) > 0 && rest[0] == tagBatchSlot {
		v, k := protowire.ConsumeVarint(rest[1:])
		if k < 0 || v > FenceSlots {
			return b, 0, 0, false
		}
		slot, rest = uint32(v), rest[1+k:]
	}
	return rest, deadline, slot, true
}

// windowFields finds a batch's deadline and fence slot anywhere in b.
func windowFields(b []byte) (deadline uint64, slot uint32, err error) {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return deadline, slot, err
		}
		switch f.num {
		case fBatchDeadlineNS:
			deadline, err = f.varint("deadline")
		case fBatchFenceSlot:
			slot, err = f.uint32("fence slot") // the last one wins; Validate checks it
		}
		if err != nil {
			return 0, 0, err
		}
	}
}

// decodeItems decodes the n items of b, a body countCanonical accepted or one
// count checked.
func decodeItems(b []byte, n int, canonical, shareKeys bool) ([]Item, error) {
	if n == 0 {
		return nil, nil
	}
	d := itemDecoder{items: make([]Item, 0, n), ranges: make([]Range, n)}
	if shareKeys {
		// The keys are shorter than the body that holds them.
		d.keys = newKeyBuffer(len(b))
	}
	if canonical {
		for rest := b; len(rest) > 0; {
			var val []byte
			val, rest = nextCanonical(rest)
			if err := d.add(val); err != nil {
				return nil, err
			}
		}
		return d.items, nil
	}
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return d.items, err
		}
		if f.num != fBatchItems {
			continue
		}
		if err := f.want("items", protowire.BytesType); err != nil {
			return nil, prefixIndex("items", len(d.items), err)
		}
		if err := d.add(f.val); err != nil {
			return nil, err
		}
	}
}

// itemDecoder decodes the items of one message into slices allocated once.
type itemDecoder struct {
	items  []Item
	ranges []Range // room for the ranges of the items still to come
	keys   *keyBuffer
}

// add decodes the next item from its encoding val.
func (d *itemDecoder) add(val []byte) error {
	i := len(d.items)
	d.items = append(d.items, Item{})
	it := &d.items[i]
	if !it.unmarshalCanonical(val, d.ranges, d.keys) {
		*it = Item{}
		if err := it.unmarshal(val, d.ranges, d.keys); err != nil {
			return prefixIndex("items", i, err)
		}
	}
	if r := len(it.Ranges); r <= len(d.ranges) && (r == 0 || &it.Ranges[0] == &d.ranges[0]) {
		d.ranges = d.ranges[r:]
	}
	return nil
}

// tagBatchField is the one-byte tag of the items of a Put or Get, and of the
// results of a BatchReply (both field 1), length-delimited.
const tagBatchField = byte(fBatchItems)<<3 | byte(protowire.BytesType)

var _ = [1]struct{}{}[fBatchItems-fBatchReplyResults] // the results share the items' field number

// countCanonical counts the fields of b when b holds nothing but field 1,
// length-delimited, with one-byte tags and lengths that fit, at most max of
// them: a Put, Get or BatchReply as every encoder of the protocol writes one.
// Anything else (ok false) is left to the general walk, which skips unknown
// fields and names what is wrong.
func countCanonical(b []byte, max int) (n int, ok bool) {
	for len(b) > 0 {
		if b[0] != tagBatchField {
			return 0, false
		}
		l, k := protowire.ConsumeVarint(b[1:])
		if k < 0 || l > uint64(len(b)-1-k) {
			return 0, false
		}
		b = b[1+k+int(l):]
		if n++; n > max {
			return 0, false
		}
	}
	return n, true
}

// nextCanonical splits the next field's contents off a body countCanonical
// accepted.
func nextCanonical(b []byte) (val, rest []byte) {
	l, k := protowire.ConsumeVarint(b[1:])
	end := 1 + k + int(l)
	return b[1+k : end], b[end:]
}

// Tags, as one byte each, of the fields of an Item and a Range as this
// package encodes them.
const (
	tagItemKey      = byte(fItemKey)<<3 | byte(protowire.BytesType)
	tagItemFormat   = byte(fItemFormat)<<3 | byte(protowire.Fixed64Type)
	tagItemRanges   = byte(fItemRanges)<<3 | byte(protowire.BytesType)
	tagRangeSegment = byte(fRangeSegment)<<3 | byte(protowire.VarintType)
	tagRangeOffset  = byte(fRangeOffset)<<3 | byte(protowire.VarintType)
	tagRangeLength  = byte(fRangeLength)<<3 | byte(protowire.VarintType)
)

// unmarshalCanonical decodes an item made only of the fields Item.marshal
// writes, each with its one-byte tag and wire type, as every encoder of the
// protocol does; it reports false, having stored no key, on anything else (an
// unknown field, a wrong wire type, a truncated field, a value out of range,
// more than MaxRanges ranges, a key over MaxKey), which the general decoder
// (unmarshal) then decodes or refuses with its error. It is the same decoding
// without the general walk's per-field bookkeeping, which was a third of the
// service's time in a Get of small objects.
func (it *Item) unmarshalCanonical(b []byte, room []Range, keys *keyBuffer) bool {
	it.Ranges = room[:0]
	var key []byte
	for len(b) > 0 {
		tag := b[0]
		b = b[1:]
		switch tag {
		case tagItemKey, tagItemRanges:
			l, n := protowire.ConsumeVarint(b)
			if n < 0 || l > uint64(len(b)-n) {
				return false
			}
			val := b[n : n+int(l)]
			b = b[n+int(l):]
			if tag == tagItemKey {
				key = val
				continue
			}
			if len(it.Ranges) == MaxRanges {
				return false
			}
			var r Range
			if !r.unmarshalCanonical(val) {
				return false
			}
			it.Ranges = append(it.Ranges, r)
		case tagItemFormat:
			v, n := protowire.ConsumeFixed64(b)
			if n < 0 {
				return false
			}
			it.Format, b = v, b[n:]
		default:
			return false
		}
	}
	if len(key) > MaxKey {
		return false
	}
	switch {
	case len(key) == 0:
	case keys != nil:
		it.Key = keys.take(key)
	default:
		it.Key = string(key)
	}
	n := len(it.Ranges)
	it.Ranges = it.Ranges[:n:n] // an append by the caller must not run into the next item's ranges
	if n == 0 {
		it.Ranges = nil
	}
	return true
}

// unmarshalCanonical is Item.unmarshalCanonical for a Range.
func (r *Range) unmarshalCanonical(b []byte) bool {
	for len(b) > 0 {
		tag := b[0]
		v, n := protowire.ConsumeVarint(b[1:])
		if n < 0 {
			return false
		}
		b = b[1+n:]
		switch tag {
		case tagRangeSegment:
			if v > math.MaxUint32 {
				return false
			}
			r.Segment = uint32(v)
		case tagRangeOffset:
			r.Offset = v
		case tagRangeLength:
			r.Length = v
		default:
			return false
		}
	}
	return true
}

// keyBuffer holds the keys of one message in one allocation: each key's bytes
// are written once into a strings.Builder grown for all of them (its memory is
// not zeroed first, and what it has handed out is never written again), and the
// key is the slice of the builder's string that holds them.
type keyBuffer struct{ sb strings.Builder }

// newKeyBuffer returns a buffer with room for n bytes of keys.
func newKeyBuffer(n int) *keyBuffer {
	k := &keyBuffer{}
	k.sb.Grow(n)
	return k
}

// string is fields.string with the key copied into the buffer.
func (k *keyBuffer) string(f *fields, name string, max int) (string, error) {
	if err := f.want(name, protowire.BytesType); err != nil {
		return "", err
	}
	if len(f.val) > max {
		return "", malformed("%s is %d bytes, at most %d", name, len(f.val), max)
	}
	return k.take(f.val), nil
}

// take copies v into the buffer and returns it as a string. (Past the room it
// was grown for, the builder grows again; the keys handed out stay valid.)
func (k *keyBuffer) take(v []byte) string {
	if len(v) == 0 {
		return ""
	}
	_, _ = k.sb.Write(v)
	s := k.sb.String()
	return s[len(s)-len(v):]
}

func (m *Put) unmarshal(b []byte) (err error) {
	m.Items, m.DeadlineNS, m.FenceSlot, err = unmarshalBatch(b, false)
	return err
}

func (m *Get) unmarshal(b []byte) (err error) {
	m.Items, m.DeadlineNS, m.FenceSlot, err = unmarshalBatch(b, true)
	return err
}

func (r *Result) unmarshal(b []byte) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		switch f.num {
		case fResultStatus:
			r.Status, err = f.status("status")
		case fResultMessage:
			r.Message, err = f.string("message", MaxMessage)
		}
		if err != nil {
			return err
		}
	}
}

func (m *BatchReply) unmarshal(b []byte) error {
	if n, ok := countCanonical(b, MaxItems); ok {
		if n == 0 {
			return nil
		}
		m.Results = make([]Result, n)
		for i, rest := 0, b; len(rest) > 0; i++ {
			var val []byte
			val, rest = nextCanonical(rest)
			if len(val) == 0 {
				continue // OK: the common result, and an empty message
			}
			if err := m.Results[i].unmarshal(val); err != nil {
				return prefixIndex("results", i, err)
			}
		}
		return nil
	}
	n, err := count(b, fBatchReplyResults, "results", MaxItems)
	if err != nil || n == 0 {
		return err
	}
	m.Results = make([]Result, 0, n)
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		if f.num != fBatchReplyResults {
			continue
		}
		i := len(m.Results)
		if err := f.want("results", protowire.BytesType); err != nil {
			return prefixIndex("results", i, err)
		}
		m.Results = append(m.Results, Result{})
		if len(f.val) == 0 {
			continue // OK: the common result, and an empty message
		}
		if err := m.Results[i].unmarshal(f.val); err != nil {
			return prefixIndex("results", i, err)
		}
	}
}

func (m *Remove) unmarshal(b []byte) (err error) {
	m.Keys, err = unmarshalKeys(b, fRemoveKeys, nil)
	return err
}

func (m *RemoveReply) unmarshal(b []byte) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		if f.num == fRemoveReplyRemoved {
			if m.Removed, err = f.uint32("removed"); err != nil {
				return err
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

func (*Stats) unmarshal(b []byte) error { return skipAll(b) }
func (*Ack) unmarshal(b []byte) error   { return skipAll(b) }

func (m *StatsReply) unmarshal(b []byte) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		if f.num == fStatsReplyJSON {
			if err := f.want("json", protowire.BytesType); err != nil {
				return err
			}
			m.JSON = nil // an empty value decodes as none, as it encodes
			if len(f.val) > 0 {
				m.JSON = append([]byte(nil), f.val...)
			}
		}
	}
}

func unmarshalNonce(b []byte, nonce *uint64) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		if f.num == fNonce {
			if *nonce, err = f.fixed64("nonce"); err != nil {
				return err
			}
		}
	}
}

func (m *Ping) unmarshal(b []byte) error { return unmarshalNonce(b, &m.Nonce) }
func (m *Pong) unmarshal(b []byte) error { return unmarshalNonce(b, &m.Nonce) }

func (m *Error) unmarshal(b []byte) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		switch f.num {
		case fErrorCode:
			m.Code, err = f.status("code")
		case fErrorMessage:
			m.Message, err = f.string("message", MaxMessage)
		}
		if err != nil {
			return err
		}
	}
}

func prefixIndex(what string, i int, err error) error {
	return prefix(what+"["+strconv.Itoa(i)+"]", err)
}
