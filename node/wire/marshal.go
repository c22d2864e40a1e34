package wire

import (
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
)

// Encoding helpers. Like proto3, they leave out fields with zero values.

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func boolVarint(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}

func appendFixed64(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, v)
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendStrings(b []byte, num protowire.Number, ss []string) []byte {
	for _, s := range ss {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	return b
}

// int32Varint is how proto encodes an int32: sign-extended to 64 bits.
func int32Varint(v int32) uint64 { return uint64(int64(v)) }

func sizeVarint(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func sizeFixed64(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeFixed64()
}

func sizeString(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(s))
}

func (m Hello) Marshal(b []byte) []byte {
	b = appendVarint(b, fHelloVersion, uint64(m.Version))
	b = appendString(b, fHelloClientName, m.ClientName)
	b = appendVarint(b, fHelloPID, int32Varint(m.PID))
	return appendVarint(b, fHelloRevision, uint64(m.Revision))
}

func (m HelloReply) Marshal(b []byte) []byte {
	b = appendVarint(b, fHelloReplyClientID, m.ClientID)
	b = appendString(b, fHelloReplyServerVersion, m.ServerVersion)
	b = appendVarint(b, fHelloReplyMaxBatch, uint64(m.MaxBatch))
	b = appendVarint(b, fHelloReplyClockNS, m.ClockNS)
	b = appendFixed64(b, fHelloReplyInstanceID, m.InstanceID)
	b = appendFixed64(b, fHelloReplyContentID, m.ContentID)
	b = appendVarint(b, fHelloReplyStarting, boolVarint(m.Starting))
	b = appendVarint(b, fHelloReplyReadyPercent, uint64(m.ReadyPercent))
	b = appendVarint(b, fHelloReplyWarm, boolVarint(m.Warm))
	return appendVarint(b, fHelloReplyRevision, uint64(m.Revision))
}

func (m RegisterSegment) Marshal(b []byte) []byte {
	b = appendVarint(b, fRegisterSize, m.Size)
	b = appendString(b, fRegisterName, m.Name)
	if m.Fence {
		b = appendVarint(b, fRegisterFence, 1)
	}
	return b
}

func (m RegisterSegmentReply) Marshal(b []byte) []byte {
	return appendVarint(b, fSegmentID, uint64(m.SegmentID))
}

func (m UnregisterSegment) Marshal(b []byte) []byte {
	return appendVarint(b, fSegmentID, uint64(m.SegmentID))
}

func (m Exists) Marshal(b []byte) []byte {
	b = appendStrings(b, fExistsKeys, m.Keys)
	return appendFixed64(b, fExistsFormat, m.Format)
}

func (m ExistsReply) Marshal(b []byte) []byte {
	return appendVarint(b, fExistsReplyPresent, uint64(m.Present))
}

func (r Range) marshal(b []byte) []byte {
	b = appendVarint(b, fRangeSegment, uint64(r.Segment))
	b = appendVarint(b, fRangeOffset, r.Offset)
	return appendVarint(b, fRangeLength, r.Length)
}

// maxRangeSize is the most bytes a Range's encoding takes: three tags and
// three varints, of a uint32 and two uint64s. Less than 128, its length is one
// byte.
const maxRangeSize = 3 + 5 + 10 + 10

var _ = [1]struct{}{}[maxRangeSize>>7] // a range's length is one byte

func (r Run) marshal(b []byte) []byte {
	b = appendVarint(b, fRunSegment, uint64(r.Segment))
	b = appendVarint(b, fRunOffset, r.Offset)
	b = appendVarint(b, fRunLength, r.Length)
	b = appendVarint(b, fRunStride, r.Stride)
	return appendVarint(b, fRunCount, uint64(r.Count))
}

// maxRunSize is the most bytes a Run's encoding takes: five tags and five
// varints, of two uint32s and three uint64s; its length is one byte too.
const maxRunSize = 5 + 5 + 10 + 10 + 10 + 5

var _ = [1]struct{}{}[maxRunSize>>7] // a run's length is one byte

func (it *Item) marshal(b []byte) []byte {
	b = appendString(b, fItemKey, it.Key)
	b = appendFixed64(b, fItemFormat, it.Format)
	for _, r := range it.Ranges {
		// The length is written after the range, in the byte kept for it.
		b = append(b, tagItemRanges, 0)
		start := len(b)
		b = r.marshal(b)
		b[start-1] = byte(len(b) - start)
	}
	for _, r := range it.Runs {
		b = append(b, tagItemRuns, 0)
		start := len(b)
		b = r.marshal(b)
		b[start-1] = byte(len(b) - start)
	}
	return b
}

// marshalItems appends the items of a Put or Get. Each item is written after
// a one-byte length, which is then set, or made longer (the item moved up) for
// an item of 128 bytes or more: the same bytes as sizing each item (and each
// range) first, without the sizing pass, which cost as much as the writing in
// a batch of small objects.
func marshalItems(b []byte, items []Item) []byte {
	for i := range items {
		b = append(b, tagBatchField, 0)
		start := len(b)
		b = items[i].marshal(b)
		b = setLength(b, start)
	}
	return b
}

// setLength writes the length of b[start:] as the varint that precedes it, in
// the one byte kept for it at b[start-1], moving b[start:] up when the varint
// needs more.
func setLength(b []byte, start int) []byte {
	n := len(b) - start
	if n < 0x80 {
		b[start-1] = byte(n)
		return b
	}
	k := protowire.SizeVarint(uint64(n))
	b = slices.Grow(b, k-1)[:len(b)+k-1]
	copy(b[start+k-1:], b[start:start+n])
	protowire.AppendVarint(b[:start-1], uint64(n))
	return b
}

// The deadline and the fence slot go before the items, where the decoder's
// fast path takes them off (unmarshalBatch).
func (m Put) Marshal(b []byte) []byte {
	return marshalItems(marshalWindow(b, m.DeadlineNS, m.FenceSlot), m.Items)
}

func (m Get) Marshal(b []byte) []byte {
	return marshalItems(marshalWindow(b, m.DeadlineNS, m.FenceSlot), m.Items)
}

func marshalWindow(b []byte, deadline uint64, slot uint32) []byte {
	b = appendVarint(b, fBatchDeadlineNS, deadline)
	return appendVarint(b, fBatchFenceSlot, uint64(slot))
}

func (r Result) size() int {
	return sizeVarint(fResultStatus, uint64(r.Status)) + sizeString(fResultMessage, r.Message)
}

func (m BatchReply) Marshal(b []byte) []byte {
	for _, r := range m.Results {
		b = protowire.AppendTag(b, fBatchReplyResults, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(r.size()))
		b = appendVarint(b, fResultStatus, uint64(r.Status))
		b = appendString(b, fResultMessage, r.Message)
	}
	return b
}

func (m Remove) Marshal(b []byte) []byte { return appendStrings(b, fRemoveKeys, m.Keys) }

func (m RemoveReply) Marshal(b []byte) []byte {
	return appendVarint(b, fRemoveReplyRemoved, uint64(m.Removed))
}

func (Stats) Marshal(b []byte) []byte { return b }

func (m StatsReply) Marshal(b []byte) []byte {
	if len(m.JSON) == 0 {
		return b
	}
	b = protowire.AppendTag(b, fStatsReplyJSON, protowire.BytesType)
	return protowire.AppendBytes(b, m.JSON)
}

func (m Ping) Marshal(b []byte) []byte { return appendFixed64(b, fNonce, m.Nonce) }
func (m Pong) Marshal(b []byte) []byte { return appendFixed64(b, fNonce, m.Nonce) }
func (Ack) Marshal(b []byte) []byte    { return b }

func (m Error) Marshal(b []byte) []byte {
	b = appendVarint(b, fErrorCode, uint64(m.Code))
	return appendString(b, fErrorMessage, m.Message)
}
