package node

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node/wire"
)

// fencePage registers a fence page on c's connection and returns its counters.
func (c *rawClient) fencePage() []atomic.Uint32 {
	c.t.Helper()
	a, _ := hostmem.New(hostmem.Config{Kind: hostmem.Shm})
	r, err := a.Allocate("fence", wire.FenceBytes)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { r.Close() })
	if _, err := c.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: wire.FenceBytes, Name: "fence", Fence: true}, r.Fd()); err != nil {
		c.t.Fatal(err)
	}
	return unsafe.Slice((*atomic.Uint32)(unsafe.Pointer(unsafe.SliceData(r.Bytes()))), wire.FenceSlots)
}

// Items whose client deadline passed before the service reached them are
// neither stored (a Put) nor written into the client's memory (a Get).
func TestItemsPastTheirDeadlineTouchNothing(t *testing.T) {
	s := start(t, nil)
	c := dial(t, s)
	fence := c.fencePage()
	r, seg := c.segment(1 << 20)
	mem := r.Bytes()
	copy(mem, "stored bytes")
	if res := c.batch(wire.TypePut, item("k", seg, 0, 4096)); res[0].Status != wire.OK {
		t.Fatalf("put: %+v", res[0])
	}
	past := monoNow() - 1
	m, err := c.call(wire.TypePut, wire.Put{Items: []wire.Item{item("late", seg, 0, 4096)}, DeadlineNS: past})
	if err != nil || m.(*wire.BatchReply).Results[0].Status != wire.Busy {
		t.Fatalf("put past its deadline: %+v %v", m, err)
	}
	if res := c.batch(wire.TypeGet, item("late", seg, 8192, 4096)); res[0].Status != wire.NotFound {
		t.Fatalf("a put past its deadline was stored: %+v", res[0])
	}
	copy(mem[8192:], "the engine's bytes")
	for _, slot := range []uint32{0, 5} {
		m, err = c.call(wire.TypeGet, wire.Get{Items: []wire.Item{item("k", seg, 8192, 4096)}, DeadlineNS: past, FenceSlot: slot})
		if err != nil || m.(*wire.BatchReply).Results[0].Status != wire.Busy {
			t.Fatalf("get past its deadline (slot %d): %+v %v", slot, m, err)
		}
		if string(mem[8192:8192+18]) != "the engine's bytes" {
			t.Fatalf("a get past its deadline (slot %d) wrote the client's memory", slot)
		}
	}
	if fence[4].Load() != 0 {
		t.Fatalf("fence counter %d after the get, want 0", fence[4].Load())
	}
	if got := s.Stats().Ops.PastDeadline; got != 3 {
		t.Fatalf("pastDeadline %d, want 3", got)
	}
	// In time, with a deadline and a fence slot, both work.
	m, err = c.call(wire.TypeGet, wire.Get{Items: []wire.Item{item("k", seg, 8192, 4096)}, DeadlineNS: monoNow() + uint64(10*time.Second), FenceSlot: 5})
	if err != nil || m.(*wire.BatchReply).Results[0].Status != wire.OK || string(mem[8192:8192+12]) != "stored bytes" {
		t.Fatalf("get in time: %+v %v", m, err)
	}
}

// The stop-reuse-resume test of the protocol: the service is held inside a
// Get (as if stopped) while the client's deadline passes. Held before its copy,
// the fence counter reads 0, the client reuses its page, and the resumed
// service writes nothing into it. Held with the copy about to run, the counter
// reads 1 until the copy has ended, so the client knows to wait.
func TestAGetHeldPastItsDeadline(t *testing.T) {
	for _, where := range []string{"before the copy", "in the copy"} {
		t.Run(where, func(t *testing.T) {
			held, release := make(chan struct{}), make(chan struct{})
			releaseOnce := sync.OnceFunc(func() { close(release) })
			var armed atomic.Bool
			hold := func() {
				if armed.CompareAndSwap(true, false) {
					close(held)
					<-release
				}
			}
			s := start(t, func(c *Config) {
				if where == "in the copy" {
					c.hooks = &hooks{copying: hold}
				} else {
					c.hooks = &hooks{admitted: func(wire.Type) { hold() }}
				}
			})
			t.Cleanup(releaseOnce)
			c := dial(t, s)
			fence := c.fencePage()
			r, seg := c.segment(1 << 20)
			mem := r.Bytes()
			copy(mem, "stored bytes")
			if res := c.batch(wire.TypePut, item("k", seg, 0, 4096)); res[0].Status != wire.OK {
				t.Fatalf("put: %+v", res[0])
			}
			armed.Store(true)
			deadline := monoNow() + uint64(200*time.Millisecond)
			c.id++
			got := make(chan error, 1)
			go func() {
				_, err := send(c.conn, c.id, wire.TypeGet, wire.Get{Items: []wire.Item{item("k", seg, 8192, 4096)}, DeadlineNS: deadline, FenceSlot: 9})
				got <- err
			}()
			select {
			case <-held:
			case <-time.After(10 * time.Second):
				t.Fatal("the get was not held")
			}
			for monoNow() < deadline {
				time.Sleep(time.Millisecond)
			}
			switch n := fence[8].Load(); {
			case where == "before the copy" && n != 0:
				t.Fatalf("fence counter %d with no copy under way", n)
			case where == "in the copy" && n != 1:
				t.Fatalf("fence counter %d with a copy under way, want 1", n)
			}
			if where == "before the copy" {
				copy(mem[8192:], "the next request's KV") // the engine reuses its page
			}
			releaseOnce()
			select {
			case err := <-got:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the get did not answer")
			}
			if n := fence[8].Load(); n != 0 {
				t.Fatalf("fence counter %d after the get ended", n)
			}
			if where == "before the copy" && string(mem[8192:8192+21]) != "the next request's KV" {
				t.Fatalf("the resumed service wrote into a page the client had reused: %q", mem[8192:8192+21])
			}
		})
	}
}

// A Put held past its deadline (the service stopped with the object reserved
// and not yet copied) stores nothing once resumed, whatever the client wrote
// into its page meanwhile.
func TestAPutHeldPastItsDeadlineStoresNothing(t *testing.T) {
	g := newGate("k")
	s := start(t, func(c *Config) { c.hooks = g.hooks() })
	t.Cleanup(g.release)
	c := dial(t, s)
	r, seg := c.segment(1 << 20)
	mem := r.Bytes()
	copy(mem, "the page's KV")
	deadline := monoNow() + uint64(200*time.Millisecond)
	c.id++
	got := make(chan error, 1)
	var status wire.Status
	go func() {
		m, err := send(c.conn, c.id, wire.TypePut, wire.Put{Items: []wire.Item{item("k", seg, 0, 4096)}, DeadlineNS: deadline})
		if err == nil {
			status = m.(*wire.BatchReply).Results[0].Status
		}
		got <- err
	}()
	select {
	case <-g.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the put was not held")
	}
	for monoNow() < deadline {
		time.Sleep(time.Millisecond)
	}
	copy(mem, "another prefix's KV") // the engine reuses the page
	g.release()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if status != wire.Busy {
		t.Fatalf("put held past its deadline answered %v, want busy", status)
	}
	if res := c.batch(wire.TypeGet, item("k", seg, 8192, 4096)); res[0].Status != wire.NotFound {
		t.Fatalf("a put held past its deadline stored %q", mem[8192:8192+19])
	}
}

// A fence page is one page, one per connection, and a range never names it.
func TestFencePageRegistration(t *testing.T) {
	s := start(t, nil)
	c := dial(t, s)
	c.fencePage()
	a, _ := hostmem.New(hostmem.Config{Kind: hostmem.Shm})
	r, err := a.Allocate("fence2", wire.FenceBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := c.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: wire.FenceBytes, Name: "fence", Fence: true}, r.Fd()); err == nil {
		t.Fatal("a second fence page on one connection was accepted")
	}
	d := dial(t, s)
	big, err := a.Allocate("big", 2*wire.FenceBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	if _, err := d.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: 2 * wire.FenceBytes, Name: "fence", Fence: true}, big.Fd()); err == nil {
		t.Fatal("a fence page of two pages was accepted")
	}
	m, err := d.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: wire.FenceBytes, Name: "fence", Fence: true}, r.Fd())
	if err != nil {
		t.Fatal(err)
	}
	id := m.(*wire.RegisterSegmentReply).SegmentID
	if res := d.batch(wire.TypePut, item("k", id, 0, 8)); res[0].Status != wire.BadRange {
		t.Fatalf("a put naming the fence page: %+v", res[0])
	}
	if st := s.Stats(); st.SegmentCount != 0 {
		t.Fatalf("fence pages counted as segments: %d", st.SegmentCount)
	}
}

// A client that shrinks its fence page makes the service's counter fault: the
// get fails with a message, and the service keeps serving.
func TestAFenceThatFaultsFailsTheGetOnly(t *testing.T) {
	s := start(t, nil)
	c := dial(t, s)
	fd, err := unix.MemfdCreate("fence", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, wire.FenceBytes); err != nil {
		t.Fatal(err)
	}
	if _, err := c.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: wire.FenceBytes, Name: "fence", Fence: true}, fd); err != nil {
		t.Fatal(err)
	}
	_, seg := c.segment(1 << 20)
	if res := c.batch(wire.TypePut, item("k", seg, 0, 4096)); res[0].Status != wire.OK {
		t.Fatalf("put: %+v", res[0])
	}
	if err := unix.Ftruncate(fd, 0); err != nil {
		t.Fatal(err)
	}
	m, err := c.call(wire.TypeGet, wire.Get{Items: []wire.Item{item("k", seg, 8192, 4096)}, DeadlineNS: monoNow() + uint64(10*time.Second), FenceSlot: 3})
	if err != nil {
		t.Fatal(err)
	}
	if r := m.(*wire.BatchReply).Results[0]; r.Status != wire.BadRange || !strings.Contains(r.Message, "fence page faulted") {
		t.Fatalf("get through a faulting fence page: %+v", r)
	}
	if res := c.batch(wire.TypeGet, item("k", seg, 8192, 4096)); res[0].Status != wire.OK {
		t.Fatalf("get without the fence after the fault: %+v", res[0])
	}
}
