package node

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/node/wire"
)

// A Put's items are reserved a chunk at a time and copied afterwards
// (putBatch). When one copy faults (the client shrank its memfd), the segment
// is dropped, and every later item of the chunk in it must fail as it would
// have alone: not be stored with the bytes it never copied. (The first version
// of the chunked put stored them as zeros; the soak's truncated memfd caught
// it.)
func TestChunkedPutAfterAFaultStoresNothingItDidNotCopy(t *testing.T) {
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprint("workers=", workers), func(t *testing.T) {
			s := start(t, func(c *Config) { c.ArenaBytes = 64 << 20; c.CopyWorkers = workers })
			c := dial(t, s)
			const n, part = chunkItems + 8, 64 << 10 // over inlineBatchBytes; two chunks
			fd, mem := unsealedSegment(t, n*part, 0)
			seg := c.register(fd, n*part, "shrunk")
			for i := range mem {
				mem[i] = byte(i*7 + i>>13 + 1) // no zero page anywhere
			}
			want := bytes.Clone(mem)
			const kept = 5 // parts below the new end
			if err := unix.Ftruncate(fd, kept*part); err != nil {
				t.Fatal(err)
			}
			items := make([]wire.Item, n)
			for i := range items {
				items[i] = item(fmt.Sprint("shrunk/", i), seg, uint64(i*part), part)
			}
			res := c.batch(wire.TypePut, items...)
			r2, seg2 := c.segment(n * part)
			for i, r := range res {
				// One worker copies in order; with two, the other chunk's
				// fault may drop the segment before this one's copies.
				if i < kept && r.Status != wire.OK && (workers == 1 || r.Status != wire.BadRange) {
					t.Errorf("item %d, below the new end: %v %s", i, r.Status, r.Message)
				}
				if i >= kept && r.Status != wire.BadRange {
					t.Errorf("item %d, past the new end: %v (%s), want bad_range", i, r.Status, r.Message)
				}
				got := c.batch(wire.TypeGet, item(items[i].Key, seg2, uint64(i*part), part))[0]
				switch {
				case r.Status == wire.OK && got.Status != wire.OK:
					t.Errorf("item %d answered ok but its get answers %v", i, got.Status)
				case r.Status != wire.OK && got.Status != wire.NotFound:
					t.Errorf("item %d failed (%v) but is stored: its get answers %v", i, r.Status, got.Status)
				case got.Status == wire.OK && !bytes.Equal(r2.Bytes()[i*part:(i+1)*part], want[i*part:(i+1)*part]):
					t.Errorf("item %d is stored with other bytes than were put", i)
				}
			}
			if st := s.arena.Stats(); st.PendingBytes != 0 {
				t.Fatalf("%d bytes still pending after the put", st.PendingBytes)
			}
		})
	}
}

// Two clients put the same keys in opposite orders, each in one chunk, while
// the first put of one key is held mid-way: neither may wait for the other
// while it holds writes the other waits for (putBatch serves what it could not
// reserve only after committing its own), so both end, and every key holds its
// bytes.
func TestChunkedPutsOfTheSameKeysInOppositeOrdersBothEnd(t *testing.T) {
	const n, size = 16, 4 << 10
	g := newGate("cross/3")
	h := g.hooks()
	// B waits for whichever of A's writes it meets first, not only the held one.
	h.awaiting = func(key string) {
		select {
		case <-g.held:
			select {
			case g.waiting <- struct{}{}:
			default:
			}
		default:
		}
	}
	s := start(t, func(c *Config) { c.hooks = h })
	t.Cleanup(g.release)
	a, b := dial(t, s), dial(t, s)
	ra, sa := a.segment(2 * n * size)
	rb, sb := b.segment(2 * n * size)
	key := func(i int) string { return fmt.Sprint("cross/", i) }
	for i := range n {
		copy(ra.Bytes()[i*size:], bytes.Repeat([]byte{byte(i + 1)}, size))
		copy(rb.Bytes()[(n-1-i)*size:], bytes.Repeat([]byte{byte(i + 1)}, size))
	}
	var fwd, rev []wire.Item
	for i := range n {
		fwd = append(fwd, item(key(i), sa, uint64(i*size), size))
		rev = append(rev, item(key(n-1-i), sb, uint64(i*size), size))
	}
	aPut := a.async(wire.TypePut, fwd...)
	select {
	case <-g.held:
	case r := <-aPut:
		t.Fatalf("A's put finished without being held: %+v", r)
	case <-time.After(10 * time.Second):
		t.Fatal("A's put never reserved the held key")
	}
	bPut := b.async(wire.TypePut, rev...)
	select {
	case <-g.waiting:
	case r := <-bPut:
		t.Fatalf("B's put answered while A's write of a key it names was held: %+v", r)
	case <-time.After(10 * time.Second):
		t.Fatal("B's put neither answered nor waited for A's held write")
	}
	g.release()
	for _, p := range []struct {
		name string
		ch   <-chan batchResult
	}{{"A's put", aPut}, {"B's put", bPut}} {
		for i, r := range await(t, p.name, p.ch) {
			if r.Status != wire.OK {
				t.Fatalf("%s, item %d: %v %s", p.name, i, r.Status, r.Message)
			}
		}
	}
	var gets []wire.Item
	for i := range n {
		gets = append(gets, item(key(i), sa, uint64((n+i)*size), size))
	}
	for i, r := range a.batch(wire.TypeGet, gets...) {
		if r.Status != wire.OK {
			t.Fatalf("get %d: %v %s", i, r.Status, r.Message)
		}
		if !bytes.Equal(ra.Bytes()[(n+i)*size:(n+i+1)*size], bytes.Repeat([]byte{byte(i + 1)}, size)) {
			t.Fatalf("key %d holds other bytes than were put", i)
		}
	}
}

// A Put naming one key twice stores it once and answers both items ok: the
// second waits for the first, which its own chunk commits first.
func TestChunkedPutOfAKeyTwiceInOneBatch(t *testing.T) {
	s := start(t, nil)
	c := dial(t, s)
	r, seg := c.segment(1 << 20)
	for i := range r.Bytes()[:8192] {
		r.Bytes()[i] = byte(i*3 + 1)
	}
	res := c.batch(wire.TypePut, item("twice", seg, 0, 4096), item("other", seg, 4096, 4096), item("twice", seg, 0, 4096))
	for i, x := range res {
		if x.Status != wire.OK {
			t.Fatalf("item %d: %v %s", i, x.Status, x.Message)
		}
	}
	if got := c.batch(wire.TypeGet, item("twice", seg, 65536, 4096))[0]; got.Status != wire.OK ||
		!bytes.Equal(r.Bytes()[65536:65536+4096], r.Bytes()[:4096]) {
		t.Fatalf("get: %v", got.Status)
	}
	if st := s.arena.Stats(); st.Objects != 2 || st.PendingBytes != 0 {
		t.Fatalf("%d objects, %d bytes pending; want 2 and 0", st.Objects, st.PendingBytes)
	}
}
