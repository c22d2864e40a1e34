package wire

import (
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

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

func (r *Run) unmarshal(b []byte) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		switch f.num {
		case fRunSegment:
			r.Segment, err = f.uint32("segment")
		case fRunOffset:
			r.Offset, err = f.varint("offset")
		case fRunLength:
			r.Length, err = f.varint("length")
		case fRunStride:
			r.Stride, err = f.varint("stride")
		case fRunCount:
			r.Count, err = f.uint32("count")
		}
		if err != nil {
			return err
		}
	}
}

// unmarshal decodes an item. Its ranges are appended to room[:0] and its runs
// to runRoom[:0], which have space for the common case (see decodeItems), so
// they cost no allocation.
func (it *Item) unmarshal(b []byte, room []Range, runRoom []Run, keys *keyBuffer) error {
	it.Ranges, it.Runs = room[:0], runRoom[:0]
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
		case fItemRuns:
			if err = f.want("runs", protowire.BytesType); err == nil {
				i := len(it.Runs)
				it.Runs = append(it.Runs, Run{})
				if err = it.Runs[i].unmarshal(f.val); err != nil {
					err = prefixIndex("runs", i, err)
				}
			}
		}
		if err != nil {
			return err
		}
	}
	it.clip()
	return nil
}

// clip caps the item's ranges and runs at their lengths, so that an append by
// the caller must not run into the next item's, and makes empty ones nil.
func (it *Item) clip() {
	n := len(it.Ranges)
	it.Ranges = it.Ranges[:n:n]
	if n == 0 {
		it.Ranges = nil
	}
	n = len(it.Runs)
	it.Runs = it.Runs[:n:n]
	if n == 0 {
		it.Runs = nil
	}
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
// Runs get their room once the first item with runs shows (a batch of ranges
// pays nothing for them): one run for each item still to come.
type itemDecoder struct {
	items  []Item
	ranges []Range // room for the ranges of the items still to come
	runs   []Run   // room for the runs of the items still to come
	keys   *keyBuffer
}

// add decodes the next item from its encoding val.
func (d *itemDecoder) add(val []byte) error {
	i := len(d.items)
	d.items = append(d.items, Item{})
	it := &d.items[i]
	if !it.unmarshalCanonical(val, d.ranges, d.runs, d.keys) {
		*it = Item{}
		if err := it.unmarshal(val, d.ranges, d.runs, d.keys); err != nil {
			return prefixIndex("items", i, err)
		}
	}
	if r := len(it.Ranges); r <= len(d.ranges) && (r == 0 || &it.Ranges[0] == &d.ranges[0]) {
		d.ranges = d.ranges[r:]
	}
	switch r := len(it.Runs); {
	case r == 0:
	case len(d.runs) == 0:
		d.runs = make([]Run, cap(d.items)-len(d.items))
	case r <= len(d.runs) && &it.Runs[0] == &d.runs[0]:
		d.runs = d.runs[r:]
	}
	return nil
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
