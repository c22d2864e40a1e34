package node

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stratakv/strata/node/wire"
)

// TestSmallGetsAnswerAsItemByItem checks the two ways a Get under
// inlineBatchBytes is served from leases taken in one batch: on the
// connection's goroutine when the arena holds every object (getInArena), and
// on the request's goroutine with the misses served one by one after the
// leases end (getSmall). Each item must be answered as a Get of it alone
// answers it: hits copied, a spilled object promoted, a missing key and an
// object in another format not found, a range outside the client's segments
// refused, a key named twice served twice; and the counters must count each
// once.
func TestSmallGetsAnswerAsItemByItem(t *testing.T) {
	s := start(t, func(c *Config) { c.ArenaBytes = 1 << 20; c.SpillDir = t.TempDir() })
	c := dial(t, s)
	r, seg := c.segment(4 << 20)
	mem := r.Bytes()
	const size = 1024
	fill := func(off, seed int) {
		for j := range size {
			mem[off+j] = byte(seed*7 + j)
		}
	}
	// o0..o3 are evicted to the spill by the 64 KiB objects after them.
	for i := range 4 {
		fill(i*size, i)
		if res := c.batch(wire.TypePut, item(fmt.Sprintf("o%d", i), seg, uint64(i*size), size)); res[0].Status != wire.OK {
			t.Fatalf("put o%d: %+v", i, res[0])
		}
	}
	// Which objects a Reserve's region eviction frees first depends on where
	// the background eviction has got to, so put big ones until o0 has gone,
	// within a bound.
	for i := 0; i < 24 || s.arena.Contains("o0", 7); i++ {
		if i == 400 {
			t.Fatalf("o0 was not spilled after %d puts of 64 KiB: %+v", i, s.Stats().Arena)
		}
		if res := c.batch(wire.TypePut, item(fmt.Sprintf("big%d", i), seg, 1<<20, 64<<10)); res[0].Status != wire.OK {
			t.Fatalf("put big%d: %+v", i, res[0])
		}
	}
	if st := s.Stats(); st.Arena.Spilled == 0 {
		t.Fatalf("nothing was spilled: %+v", st.Arena)
	}
	for i := 4; i < 12; i++ {
		fill(i*size, i)
		if res := c.batch(wire.TypePut, item(fmt.Sprintf("o%d", i), seg, uint64(i*size), size)); res[0].Status != wire.OK {
			t.Fatalf("put o%d: %+v", i, res[0])
		}
	}
	f8 := item("f8", seg, uint64(12*size), size)
	f8.Format = 8
	if res := c.batch(wire.TypePut, f8); res[0].Status != wire.OK {
		t.Fatalf("put f8: %+v", res[0])
	}
	want := func(seed int) []byte {
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(seed*7 + j)
		}
		return b
	}
	dst := func(i int) uint64 { return uint64(2<<20 + i*size) }
	check := func(what string, res []wire.Result, wantStatus []wire.Status, seeds []int) {
		t.Helper()
		for i := range wantStatus {
			if res[i].Status != wantStatus[i] {
				t.Fatalf("%s: item %d: %v %q, want %v", what, i, res[i].Status, res[i].Message, wantStatus[i])
			}
			if seeds[i] >= 0 && !bytes.Equal(mem[dst(i):dst(i)+size], want(seeds[i])) {
				t.Fatalf("%s: item %d: bytes differ", what, i)
			}
		}
	}

	// Every object in the arena: served inline.
	before := s.Stats().Ops
	res := c.batch(wire.TypeGet, item("o4", seg, dst(0), size), item("o11", seg, dst(1), size), item("o4", seg, dst(2), size))
	check("all in the arena", res, []wire.Status{wire.OK, wire.OK, wire.OK}, []int{4, 11, 4})
	if st := s.Stats().Ops; st.Gets != before.Gets+1 || st.ArenaHits != before.ArenaHits+3 || st.Misses != before.Misses {
		t.Fatalf("counters after an inline get: %+v, before %+v", st, before)
	}

	// Hits, a spilled object, a missing key, another format, a bad range: the
	// leased ones first, the others one by one.
	before = s.Stats().Ops
	clear(mem[dst(0) : dst(0)+8*size])
	res = c.batch(wire.TypeGet,
		item("o6", seg, dst(0), size),
		item("o0", seg, dst(1), size), // spilled: promoted
		item("missing", seg, dst(2), size),
		item("o7", seg, dst(3), size),
		item("f8", seg, dst(4), size), // stored in format 8, asked in 7
		item("o8", 99, 0, size),       // no such segment
		item("o6", seg, dst(6), size),
	)
	check("mixed", res,
		[]wire.Status{wire.OK, wire.OK, wire.NotFound, wire.OK, wire.NotFound, wire.BadRange, wire.OK},
		[]int{6, 0, -1, 7, -1, -1, 6})
	st := s.Stats().Ops
	if st.Gets != before.Gets+1 || st.ArenaHits != before.ArenaHits+3 || st.SpillHits != before.SpillHits+1 || st.Misses != before.Misses+2 {
		t.Fatalf("counters after a mixed get: %+v, before %+v", st, before)
	}
	// The promoted object is in the arena again: the next Get of it is inline.
	res = c.batch(wire.TypeGet, item("o0", seg, dst(0), size))
	check("promoted", res, []wire.Status{wire.OK}, []int{0})
	if a := s.Stats().Arena; a.Leases != 0 {
		t.Fatalf("%d leases left after the gets", a.Leases)
	}
}
