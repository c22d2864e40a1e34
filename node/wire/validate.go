package wire

import (
	"fmt"
	"math"
	"math/bits"
	"unicode/utf8"
)

// Validation. Every decoder ends with the message's Validate, and Conn.Send calls
// it before writing.

// ValidKey reports whether k can name an object: 1 to MaxKey bytes of printable
// ASCII. The error wraps ErrMalformed.
func ValidKey(k string) error {
	if len(k) == 0 {
		return malformed("key is empty")
	}
	if len(k) > MaxKey {
		return malformed("key %.40q... is %d bytes, at most %d", k, len(k), MaxKey)
	}
	if printable(k) {
		return nil
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < 0x20 || c > 0x7e {
			return malformed("key %.40q has byte %#02x at %d; keys are printable ASCII", k, c, i)
		}
	}
	return nil
}

// printable reports whether every byte of k is in 0x20..0x7e, sixteen bytes at
// a time: every request names up to 4096 keys, and a byte-by-byte loop was a
// tenth of an Exists round trip. The words' verdicts are ORed and looked at
// once, at the end: a branch per word cost half the time of a 100-byte key.
func printable(k string) bool {
	var acc uint64
	for len(k) >= 16 {
		acc |= outOfRange(word(k)) | outOfRange(word(k[8:]))
		k = k[16:]
	}
	if len(k) >= 8 {
		acc |= outOfRange(word(k))
		k = k[8:]
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < 0x20 || c > 0x7e {
			return false
		}
	}
	return acc&0x8080808080808080 == 0
}

// word is the first 8 bytes of s, little-endian (one load).
func word(s string) uint64 {
	s = s[:8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// outOfRange sets the high bit of each byte of w outside 0x20..0x7e: one that
// has it already, one below 0x20 (w-0x20 borrows into its high bit), or 0x7f
// (w+1 carries into it). Bytes in range never carry or borrow into their
// neighbours, so a word of them comes out with no high bit; a byte out of range
// may spoil its neighbours' bits, but the word is rejected anyway.
func outOfRange(w uint64) uint64 {
	const ones = 0x0101010101010101
	return w | (w - 0x20*ones) | (w + ones)
}

func validText(what, s string, max int) error {
	if len(s) > max {
		return malformed("%s is %d bytes, at most %d", what, len(s), max)
	}
	if !utf8.ValidString(s) {
		return malformed("%s is not valid UTF-8", what)
	}
	return nil
}

func validKeys(keys []string) error {
	if len(keys) > MaxItems {
		return malformed("%d keys, at most %d", len(keys), MaxItems)
	}
	for i, k := range keys {
		if err := ValidKey(k); err != nil {
			return fmt.Errorf("keys[%d]: %w", i, err)
		}
	}
	return nil
}

func validStatus(what string, s Status) error {
	if !s.Valid() {
		return malformed("%s %d is not a known status (0 to %d)", what, s, maxStatus)
	}
	return nil
}

func (m Hello) Validate() error {
	return validText("client name", m.ClientName, MaxName)
}

func (m HelloReply) Validate() error {
	if m.ReadyPercent > 100 {
		return malformed("ready percent %d over 100", m.ReadyPercent)
	}
	return validText("server version", m.ServerVersion, MaxName)
}

func (m RegisterSegment) Validate() error {
	if m.Size == 0 {
		return malformed("segment size is 0")
	}
	return validText("segment name", m.Name, MaxName)
}

func (RegisterSegmentReply) Validate() error { return nil }
func (UnregisterSegment) Validate() error    { return nil }

func (m Exists) Validate() error { return validKeys(m.Keys) }

func (m ExistsReply) Validate() error {
	if m.Present > MaxItems {
		return malformed("%d keys present, a batch has at most %d", m.Present, MaxItems)
	}
	return nil
}

// Validate checks the item: a valid key, and its bytes named by ranges or by
// runs, never both: 1 to MaxRanges ranges of non-zero length whose ends and
// total do not overflow uint64, or 1 to MaxRuns valid runs (Run.validate) of
// at most MaxRunCount ranges in all, whose total does not overflow.
func (it Item) Validate() error {
	if err := ValidKey(it.Key); err != nil {
		return err
	}
	switch {
	case len(it.Ranges) > 0 && len(it.Runs) > 0:
		return malformed("item %q has both ranges and runs; name its bytes by one or the other", it.Key)
	case len(it.Runs) > 0:
		return it.validRuns()
	case len(it.Ranges) == 0:
		return malformed("item %q has no ranges and no runs", it.Key)
	case len(it.Ranges) > MaxRanges:
		return malformed("item %q has %d ranges, at most %d", it.Key, len(it.Ranges), MaxRanges)
	}
	var total uint64
	for i, r := range it.Ranges {
		if r.Length == 0 {
			return malformed("item %q: ranges[%d] has length 0", it.Key, i)
		}
		if r.Offset > math.MaxUint64-r.Length {
			return malformed("item %q: ranges[%d] offset %#x + length %d overflows", it.Key, i, r.Offset, r.Length)
		}
		if total > math.MaxUint64-r.Length {
			return malformed("item %q: total length overflows", it.Key)
		}
		total += r.Length
	}
	return nil
}

func (it Item) validRuns() error {
	if len(it.Runs) > MaxRuns {
		return malformed("item %q has %d runs, at most %d", it.Key, len(it.Runs), MaxRuns)
	}
	var total uint64
	spans := 0
	for i, r := range it.Runs {
		if err := r.validate(); err != nil {
			return fmt.Errorf("item %q: runs[%d]: %w", it.Key, i, err)
		}
		if spans += int(r.Count); spans > MaxRunCount {
			return malformed("item %q: its runs stand for more than %d ranges", it.Key, MaxRunCount)
		}
		// Count is at most MaxRunCount: the product needs only a check of the sum.
		hi, n := bits.Mul64(uint64(r.Count), r.Length)
		if hi != 0 || total > math.MaxUint64-n {
			return malformed("item %q: total length overflows", it.Key)
		}
		total += n
	}
	return nil
}

// validate checks a run on its own: a non-zero length, a count of 1 to
// MaxRunCount, a stride of at least the length when the count is over 1 (the
// ranges ascend and do not overlap), and an end (Run.End) that does not
// overflow uint64.
func (r Run) validate() error {
	switch {
	case r.Length == 0:
		return malformed("length 0")
	case r.Count == 0 || r.Count > MaxRunCount:
		return malformed("count %d, want 1 to %d", r.Count, MaxRunCount)
	case r.Count > 1 && r.Stride < r.Length:
		return malformed("stride %d under length %d: a run's ranges must not overlap", r.Stride, r.Length)
	}
	hi, span := bits.Mul64(uint64(r.Count-1), r.Stride)
	if hi != 0 || r.Offset > math.MaxUint64-span || r.Offset+span > math.MaxUint64-r.Length {
		return malformed("offset %#x + %d strides of %d + length %d overflows", r.Offset, r.Count-1, r.Stride, r.Length)
	}
	return nil
}

func validItems(items []Item) error {
	if len(items) > MaxItems {
		return malformed("%d items, at most %d", len(items), MaxItems)
	}
	spans := 0
	for i := range items {
		if err := items[i].Validate(); err != nil {
			return fmt.Errorf("items[%d]: %w", i, err)
		}
		if spans += items[i].Spans(); spans > MaxBatchRanges {
			return malformed("items[%d]: the batch's items name more than %d ranges, runs expanded", i, MaxBatchRanges)
		}
	}
	return nil
}

func (m Put) Validate() error { return validBatch(m.Items, m.FenceSlot) }
func (m Get) Validate() error { return validBatch(m.Items, m.FenceSlot) }

func validBatch(items []Item, slot uint32) error {
	if slot > FenceSlots {
		return malformed("fence slot %d, at most %d", slot, FenceSlots)
	}
	return validItems(items)
}

func (m BatchReply) Validate() error {
	if len(m.Results) > MaxItems {
		return malformed("%d results, at most %d", len(m.Results), MaxItems)
	}
	for i, r := range m.Results {
		if err := validStatus("status", r.Status); err != nil {
			return fmt.Errorf("results[%d]: %w", i, err)
		}
		if err := validText("message", r.Message, MaxMessage); err != nil {
			return fmt.Errorf("results[%d]: %w", i, err)
		}
	}
	return nil
}

func (m Remove) Validate() error { return validKeys(m.Keys) }

func (m RemoveReply) Validate() error {
	if m.Removed > MaxItems {
		return malformed("%d keys removed, a batch has at most %d", m.Removed, MaxItems)
	}
	return nil
}

func (Stats) Validate() error      { return nil }
func (StatsReply) Validate() error { return nil }
func (Ping) Validate() error       { return nil }
func (Pong) Validate() error       { return nil }
func (Ack) Validate() error        { return nil }

func (m Error) Validate() error {
	if m.Code == OK {
		return malformed("error code is ok; an Error must carry a failure status")
	}
	if err := validStatus("error code", m.Code); err != nil {
		return err
	}
	return validText("message", m.Message, MaxMessage)
}
