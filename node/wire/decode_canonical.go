package wire

import (
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

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
	tagItemRuns     = byte(fItemRuns)<<3 | byte(protowire.BytesType)
	tagRangeSegment = byte(fRangeSegment)<<3 | byte(protowire.VarintType)
	tagRangeOffset  = byte(fRangeOffset)<<3 | byte(protowire.VarintType)
	tagRangeLength  = byte(fRangeLength)<<3 | byte(protowire.VarintType)
)

// unmarshalCanonical decodes an item made only of the fields Item.marshal
// writes, each with its one-byte tag and wire type, as every encoder of the
// protocol does; it reports false, having stored no key, on anything else (an
// unknown field, a wrong wire type, a truncated field, a value out of range,
// more than MaxRanges ranges or MaxRuns runs, a key over MaxKey), which the general decoder
// (unmarshal) then decodes or refuses with its error. It is the same decoding
// without the general walk's per-field bookkeeping, which was a third of the
// service's time in a Get of small objects.
func (it *Item) unmarshalCanonical(b []byte, room []Range, runRoom []Run, keys *keyBuffer) bool {
	it.Ranges, it.Runs = room[:0], runRoom[:0]
	var key []byte
	for len(b) > 0 {
		tag := b[0]
		b = b[1:]
		switch tag {
		case tagItemKey, tagItemRanges, tagItemRuns:
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
			if tag == tagItemRuns {
				var r Run
				if len(it.Runs) == MaxRuns || !r.unmarshalCanonical(val) {
					return false
				}
				it.Runs = append(it.Runs, r)
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
	it.clip()
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

// Tags of a Run's fields as this package encodes them.
const (
	tagRunSegment = byte(fRunSegment)<<3 | byte(protowire.VarintType)
	tagRunOffset  = byte(fRunOffset)<<3 | byte(protowire.VarintType)
	tagRunLength  = byte(fRunLength)<<3 | byte(protowire.VarintType)
	tagRunStride  = byte(fRunStride)<<3 | byte(protowire.VarintType)
	tagRunCount   = byte(fRunCount)<<3 | byte(protowire.VarintType)
)

// unmarshalCanonical is Item.unmarshalCanonical for a Run.
func (r *Run) unmarshalCanonical(b []byte) bool {
	for len(b) > 0 {
		tag := b[0]
		v, n := protowire.ConsumeVarint(b[1:])
		if n < 0 {
			return false
		}
		b = b[1+n:]
		switch tag {
		case tagRunSegment, tagRunCount:
			if v > math.MaxUint32 {
				return false
			}
			if tag == tagRunSegment {
				r.Segment = uint32(v)
			} else {
				r.Count = uint32(v)
			}
		case tagRunOffset:
			r.Offset = v
		case tagRunLength:
			r.Length = v
		case tagRunStride:
			r.Stride = v
		default:
			return false
		}
	}
	return true
}
