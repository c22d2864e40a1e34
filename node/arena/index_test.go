package arena

import (
	"hash/maphash"
	"testing"
	"unsafe"

	"github.com/stratakv/strata/internal/memstat"
)

// TestLookupComparesKeys: a key that shares another's hash is not found as it,
// so a collision never serves a foreign object. Both places a key lies are
// covered: after a small object's bytes in its slot, and in a large object's
// descriptor slot.
func TestLookupComparesKeys(t *testing.T) {
	a := newArena(t, testConfig(t, 1<<20))
	put(t, a, "small", 1, 100)
	put(t, a, "large-object-with-a-key-longer-than-one-key-block-of-sixty-bytes", 1, 8192)
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range []struct{ stored, other string }{
		{"small", "smalL"},
		{"small", "smal"},
		{"large-object-with-a-key-longer-than-one-key-block-of-sixty-bytes", "large-object-with-a-key-longer-than-one-key-block-of-sixty-byteS"},
		{"large-object-with-a-key-longer-than-one-key-block-of-sixty-bytes", "large-object-with-a-key-longer-than-one-key-block-of-sixty-bytesX"},
	} {
		h := maphash.String(a.seed, c.stored)
		if a.lookupLocked(c.stored, h) == 0 {
			t.Fatalf("%s is not found", c.stored)
		}
		if idx := a.lookupLocked(c.other, h); idx != 0 {
			t.Fatalf("%s, under the hash of %s, found record %d", c.other, c.stored, idx)
		}
	}
}

// TestIndexStaysOffTheGoHeap: 200k small objects grow the Go heap by next to
// nothing (the map-of-structs index took ~376 B each), and their metadata, the
// index's mapped bytes, stays within budget.
func TestIndexStaysOffTheGoHeap(t *testing.T) {
	const n = 200_000
	a := newArena(t, testConfig(t, 64<<20))
	heap0 := memstat.HeapInuse()
	buf := make([]byte, 0, 80)
	for i := range n {
		put(t, a, string(smallKey(buf, i)), 1, int(smallSize(i)))
	}
	grew := memstat.HeapInuse() - heap0
	st := a.Stats()
	t.Logf("%d objects: Go heap grew %d bytes, the index maps %d bytes (%.1f per object), objects use %.1f bytes each",
		n, grew, st.IndexBytes, float64(st.IndexBytes)/n, float64(st.UsedBytes)/n)
	if grew > n*8 {
		t.Fatalf("%d objects grew the Go heap by %d bytes: the index is meant to be off it", n, grew)
	}
	// Records (48 B), table slots (8 B at a load of 3/8 to 3/4), and at this
	// scale a few chunks not yet full.
	if per := st.IndexBytes / n; per > 128 {
		t.Fatalf("the index maps %d bytes per object, over the 128 B budget", per)
	}
	mustCheck(t, a)
	for i := range n {
		if i%1000 == 0 {
			read(t, a, string(smallKey(buf, i)), 1, int(smallSize(i)))
		}
	}
}

// The record's size is the per-object metadata budget's largest part.
func TestRecordIs48Bytes(t *testing.T) {
	if n := unsafe.Sizeof(record{}); n != 48 {
		t.Fatalf("a record takes %d bytes, want 48: the index's memory per object grows with it", n)
	}
}
