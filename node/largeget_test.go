package node

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stratakv/strata/node/wire"
)

// A Get of at least inlineBatchBytes is served chunkItems items at a time
// (getLarge). Every item of such a batch must come back as a Get of it alone
// would answer it, wherever it falls in its chunk: hits with their bytes,
// misses, another format, a range outside the client's segments, and memory
// another item names too.
func TestLargeGetAnswersEveryItemAsAloneWherever(t *testing.T) {
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprint("workers=", workers), func(t *testing.T) {
			s := start(t, func(c *Config) { c.ArenaBytes = 64 << 20; c.CopyWorkers = workers })
			c := dial(t, s)
			const n, size = 3*chunkItems + 5, 16 << 10 // over inlineBatchBytes, chunks not full
			r, seg := c.segment(2 * n * size)
			mem := r.Bytes()
			for i := range mem[:n*size] {
				mem[i] = byte(i*13 + i>>10)
			}
			key := func(i int) string { return fmt.Sprintf("lg/%d", i) }
			// Stored: every item but those with i%7 == 3 (misses); i%11 == 5 in
			// another format.
			var puts []wire.Item
			for i := range n {
				if i%7 == 3 {
					continue
				}
				it := item(key(i), seg, uint64(i*size), size)
				if i%11 == 5 {
					it.Format = 8
				}
				puts = append(puts, it)
			}
			for _, res := range c.batch(wire.TypePut, puts...) {
				if res.Status != wire.OK {
					t.Fatalf("put: %v %s", res.Status, res.Message)
				}
			}
			want := func(i int) wire.Status {
				switch {
				case i == 40 || i == 41 || i == 90:
					return wire.BadRange
				case i%7 == 3, i%11 == 5, i == 70:
					return wire.NotFound
				}
				return wire.OK
			}
			gets := make([]wire.Item, n)
			for i := range gets {
				gets[i] = item(key(i), seg, uint64((n+i)*size), size)
			}
			gets[40].Ranges[0].Offset = 1 << 40                   // outside the segment
			gets[41].Ranges[0].Offset = gets[42].Ranges[0].Offset // the same bytes as 42
			gets[90].Ranges[0].Segment = seg + 7                  // a segment never registered
			gets[70].Format = 9                                   // a chunk of two formats: served one by one
			clear(mem[n*size:])
			res := c.batch(wire.TypeGet, gets...)
			if len(res) != n {
				t.Fatalf("%d results for %d items", len(res), n)
			}
			for i, got := range res {
				w := want(i)
				if i == 42 {
					w = wire.BadRange // the other side of the overlap with 41
				}
				if got.Status != w {
					t.Errorf("item %d: %v (%s), want %v", i, got.Status, got.Message, w)
					continue
				}
				if w != wire.OK {
					continue
				}
				if !bytes.Equal(mem[(n+i)*size:(n+i+1)*size], mem[i*size:(i+1)*size]) {
					t.Errorf("item %d: the bytes got are not the bytes put", i)
				}
			}
			if t.Failed() {
				return
			}
			// Nothing stays leased.
			if st := s.arena.Stats(); st.LeasedObjects != 0 {
				t.Fatalf("%d objects still leased after the get", st.LeasedObjects)
			}
		})
	}
}

// A large Get of a key whose put is held mid-way (after its Reserve, before
// its copy) waits for the put and returns its bytes, as a small Get does:
// the chunk's other items are served meanwhile and answered together.
func TestLargeGetWaitsForAPutHeldMidway(t *testing.T) {
	g := newGate("lg/held")
	s := start(t, func(c *Config) { c.ArenaBytes = 64 << 20; c.hooks = g.hooks() })
	t.Cleanup(g.release)
	a, b := dial(t, s), dial(t, s)
	const n, size = 2 * chunkItems, 32 << 10
	ra, sa := a.segment(n * size)
	rb, sb := b.segment(n * size)
	for i := range ra.Bytes() {
		ra.Bytes()[i] = byte(i*3 + i>>9)
	}
	var puts []wire.Item
	for i := range n {
		if i != 7 {
			puts = append(puts, item(fmt.Sprint("lg/", i), sa, uint64(i*size), size))
		}
	}
	for _, res := range a.batch(wire.TypePut, puts...) {
		if res.Status != wire.OK {
			t.Fatalf("put: %v %s", res.Status, res.Message)
		}
	}
	held := a.async(wire.TypePut, item("lg/held", sa, 7*size, size))
	select {
	case <-g.held:
	case r := <-held:
		t.Fatalf("the put finished without being held: %+v", r)
	case <-time.After(10 * time.Second):
		t.Fatal("the put never reserved its key")
	}
	gets := make([]wire.Item, n)
	for i := range gets {
		gets[i] = item(fmt.Sprint("lg/", i), sb, uint64(i*size), size)
	}
	gets[7].Key = "lg/held"
	get := b.async(wire.TypeGet, gets...)
	select {
	case <-g.waiting:
	case r := <-get:
		t.Fatalf("the get answered while the put it needs was held: %+v", r)
	case <-time.After(10 * time.Second):
		t.Fatal("the get neither answered nor waited for the held put")
	}
	g.release()
	if res := await(t, "the held put", held); res[0].Status != wire.OK {
		t.Fatalf("held put: %+v", res[0])
	}
	res := await(t, "the get", get)
	for i, r := range res {
		if r.Status != wire.OK {
			t.Fatalf("item %d: %v %s", i, r.Status, r.Message)
		}
	}
	if !bytes.Equal(rb.Bytes(), ra.Bytes()) {
		t.Fatal("the get's bytes are not the bytes put")
	}
}
