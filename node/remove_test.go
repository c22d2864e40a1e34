package node

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratakv/strata/internal/redistest"
	"github.com/stratakv/strata/node/wire"
)

// send is one request and its reply on conn, for goroutines other than the
// test's (rawClient.call reports through t).
func send(conn *wire.Conn, id uint64, t wire.Type, msg wire.Message) (wire.Message, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := conn.Send(ctx, t, id, msg); err != nil {
		return nil, err
	}
	h, m, _, err := conn.Recv(ctx)
	switch {
	case err != nil:
		return nil, err
	case h.ID != id:
		return nil, fmt.Errorf("reply to request %d, want %d", h.ID, id)
	}
	if e, ok := m.(*wire.Error); ok {
		return nil, e.Err()
	}
	return m, nil
}

// stamp fills b with bytes that name key and generation gen.
func stamp(b []byte, key string, gen uint64) {
	var x uint64 = gen*0x9e3779b97f4a7c15 + 1
	for _, c := range []byte(key) {
		x = x*31 + uint64(c)
	}
	for i := 0; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
}

// stamped reports which of gens b holds for key, or -1.
func stamped(b []byte, key string, gens ...uint64) int {
	want := make([]byte, len(b))
	for i, g := range gens {
		stamp(want, key, g)
		if string(want) == string(b) {
			return i
		}
	}
	return -1
}

// A Remove that lands while the arena's eviction is copying the object to the
// spill must win: the removed key is gone from every tier, a new Put of it
// stores the new bytes and Gets serve them, also after a restart. It used to
// lose: the spill did not hold the object yet when the Remove asked it, the
// eviction then stored it, and the key read back with its old bytes, a re-Put
// being skipped as write-once.
func TestRemoveWinsOverAnEvictionInFlight(t *testing.T) {
	const obj = 1 << 20
	spillDir := t.TempDir()
	held, release := make(chan struct{}), make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	var armed atomic.Bool
	var holdOnce sync.Once
	tweak := func(c *Config) {
		// Room for 8 objects and the slab of their descriptors: the 8th passes
		// the high watermark without needing an eviction to fit.
		c.ArenaBytes = 8<<20 + 512<<10
		c.SpillDir = spillDir
		c.hooks = &hooks{spilling: func(key string) {
			if key == "victim" && armed.Load() {
				holdOnce.Do(func() { close(held); <-release })
			}
		}}
	}
	s := start(t, tweak)
	t.Cleanup(releaseOnce) // before the server's Close, which waits for the eviction
	a, b := dial(t, s), dial(t, s)
	ra, sa := a.segment(2 * obj)
	mem := ra.Bytes()
	stamp(mem[:obj], "victim", 0)
	if res := a.batch(wire.TypePut, item("victim", sa, 0, obj)); res[0].Status != wire.OK {
		t.Fatalf("put victim: %+v", res[0])
	}
	armed.Store(true)
	// Fill the arena past its high watermark: the background evictor takes the
	// least recently used object, the victim, and is held mid-eviction.
	for i := 0; ; i++ {
		select {
		case <-held:
		case <-time.After(time.Duration(min(i, 1)) * time.Millisecond):
			if i > 64 {
				t.Fatal("the victim was never evicted")
			}
			key := fmt.Sprintf("filler-%d", i)
			stamp(mem[obj:], key, 0)
			if res := a.batch(wire.TypePut, item(key, sa, obj, obj)); res[0].Status != wire.OK {
				t.Fatalf("put %s: %+v", key, res[0])
			}
			continue
		}
		break
	}
	removed := make(chan error, 1)
	go func() {
		m, err := send(b.conn, 1000, wire.TypeRemove, wire.Remove{Keys: []string{"victim"}})
		if err == nil && m.(*wire.RemoveReply).Removed != 1 {
			err = fmt.Errorf("removed %d objects, want 1", m.(*wire.RemoveReply).Removed)
		}
		removed <- err
	}()
	// Hold the eviction until the remove waits for it (or, on a service where it
	// does not, has answered).
	var early error
	answered := false
	for deadline := time.Now().Add(10 * time.Second); s.arena.Stats().RemoveWaits == 0 && !answered; {
		select {
		case early = <-removed:
			answered = true
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the remove neither waited for the eviction nor answered")
		}
	}
	releaseOnce()
	if !answered {
		select {
		case early = <-removed:
		case <-time.After(10 * time.Second):
			t.Fatal("the remove did not answer after the eviction ended")
		}
	}
	if early != nil {
		t.Fatal(early)
	}
	b.id = 2000
	checkGone := func(c *rawClient, when string) {
		t.Helper()
		res := c.batch(wire.TypeGet, item("victim", sa, 0, obj))
		if res[0].Status == wire.OK {
			which := stamped(mem[:obj], "victim", 0, 1)
			t.Fatalf("%s: a removed key reads back (generation %d of its bytes)", when, which)
		}
	}
	checkGone(a, "after the remove")
	if m, err := a.call(wire.TypeExists, wire.Exists{Keys: []string{"victim"}, Format: 7}); err != nil || m.(*wire.ExistsReply).Present != 0 {
		t.Fatalf("exists of a removed key: %+v %v", m, err)
	}
	stamp(mem[:obj], "victim", 1)
	if res := a.batch(wire.TypePut, item("victim", sa, 0, obj)); res[0].Status != wire.OK {
		t.Fatalf("put of the removed key: %+v", res[0])
	}
	clear(mem[:obj])
	if res := a.batch(wire.TypeGet, item("victim", sa, 0, obj)); res[0].Status != wire.OK {
		t.Fatalf("get after the new put: %+v", res[0])
	} else if g := stamped(mem[:obj], "victim", 0, 1); g != 1 {
		t.Fatalf("get after the new put served generation %d of the bytes, want 1", g)
	}
	// After a restart the key is absent (the arena is not kept) or new, never old.
	s.Close()
	armed.Store(false)
	s2 := start(t, tweak)
	c := dial(t, s2)
	r2, s2seg := c.segment(obj)
	if res := c.batch(wire.TypeGet, item("victim", s2seg, 0, obj)); res[0].Status == wire.OK {
		if g := stamped(r2.Bytes(), "victim", 0, 1); g != 1 {
			t.Fatalf("after a restart the removed key serves generation %d of its bytes", g)
		}
	}
}

// The race of TestRemoveWinsOverAnEvictionInFlight without a hook: one
// connection streams puts into a small arena with a spill while another removes
// keys near the least recently used end, where evictions are in flight. Every
// acknowledged remove must leave its key absent, and a new put of it must be
// what gets serve. Bounded by the number of puts, not by time.
func TestRemovesRacingEvictionsNeverComeBack(t *testing.T) {
	const obj = 5 << 20 // larger than a spill buffer: written straight from the arena, a long window
	const puts = 80
	s := start(t, func(c *Config) { c.ArenaBytes = 40 << 20; c.SpillDir = t.TempDir() })
	w, rm := dial(t, s), dial(t, s)
	rw, sw := w.segment(obj)
	var progress atomic.Int64 // keys put
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Go(func() {
		defer progress.Store(puts + 100) // lets the remover finish
		for i := range puts {
			key := fmt.Sprintf("k%d", i)
			stamp(rw.Bytes(), key, 0)
			m, err := send(w.conn, uint64(1000+i), wire.TypePut, wire.Put{Items: []wire.Item{item(key, sw, 0, obj)}})
			if err != nil {
				errs <- fmt.Errorf("put %s: %w", key, err)
				return
			}
			if r := m.(*wire.BatchReply).Results[0]; r.Status != wire.OK {
				errs <- fmt.Errorf("put %s: %+v", key, r)
				return
			}
			progress.Store(int64(i + 1))
		}
	})
	var removed []string
	wg.Go(func() {
		// The arena holds 7-8 objects: after each put the evictor takes the
		// least recently used, 7 puts back, which this removes meanwhile.
		next := 0
		for id := uint64(1); next < puts; {
			target := int(progress.Load()) - 7
			if target <= next {
				time.Sleep(50 * time.Microsecond)
				continue
			}
			key := fmt.Sprintf("k%d", next)
			next++
			id++
			m, err := send(rm.conn, id, wire.TypeRemove, wire.Remove{Keys: []string{key}})
			if err != nil {
				errs <- fmt.Errorf("remove %s: %w", key, err)
				return
			}
			if m.(*wire.RemoveReply).Removed == 1 {
				removed = append(removed, key)
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(removed) < puts/2 {
		t.Fatalf("only %d removes found their object", len(removed))
	}
	w.id = 1 << 20
	back := 0
	for _, key := range removed {
		if res := w.batch(wire.TypeGet, item(key, sw, 0, obj)); res[0].Status == wire.OK {
			back++
			t.Errorf("removed key %s reads back (generation %d of its bytes)", key, stamped(rw.Bytes(), key, 0, 1))
		}
	}
	for _, key := range removed[:min(len(removed), 40)] {
		stamp(rw.Bytes(), key, 1)
		if res := w.batch(wire.TypePut, item(key, sw, 0, obj)); res[0].Status != wire.OK {
			t.Fatalf("re-put %s: %+v", key, res[0])
		}
		clear(rw.Bytes())
		if res := w.batch(wire.TypeGet, item(key, sw, 0, obj)); res[0].Status != wire.OK {
			t.Fatalf("get of re-put %s: %+v", key, res[0])
		} else if g := stamped(rw.Bytes(), key, 0, 1); g != 1 {
			t.Errorf("re-put %s: get serves generation %d of its bytes, want 1", key, g)
		}
	}
	st := s.Stats()
	t.Logf("%d removes acknowledged, %d read back; arena removals %d, remove waits %d, evictions %d, spilled %d",
		len(removed), back, st.Arena.Removals, st.Arena.RemoveWaits, st.Arena.Evictions, st.Arena.Spilled)
}

// A Remove that lands while a Get promotes the object from the spill into the
// arena must win too: the promotion must not commit the object back after the
// spill's copy is gone. It used to: the arena's remove skipped the pending
// promotion, the spill's removed its copy, and the promotion then committed.
func TestRemoveDuringAPromotionWins(t *testing.T) {
	const obj = 1 << 20
	held, release := make(chan struct{}), make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	var armed atomic.Bool
	s := start(t, func(c *Config) {
		c.ArenaBytes = 8 << 20
		c.SpillDir = t.TempDir()
		c.hooks = &hooks{promoting: func(key string) {
			if key == "k" && armed.CompareAndSwap(true, false) {
				close(held)
				<-release
			}
		}}
	})
	t.Cleanup(releaseOnce)
	a, b := dial(t, s), dial(t, s)
	ra, sa := a.segment(2 * obj)
	mem := ra.Bytes()
	stamp(mem[:obj], "k", 0)
	if res := a.batch(wire.TypePut, item("k", sa, 0, obj)); res[0].Status != wire.OK {
		t.Fatalf("put k: %+v", res[0])
	}
	for i := 0; s.arena.Contains("k", 7); i++ {
		if i > 64 {
			t.Fatal("k was never evicted")
		}
		key := fmt.Sprintf("filler-%d", i)
		if res := a.batch(wire.TypePut, item(key, sa, obj, obj)); res[0].Status != wire.OK {
			t.Fatalf("put %s: %+v", key, res[0])
		}
	}
	waitEvictionsDone(t, s)
	armed.Store(true)
	clear(mem[:obj])
	got := a.async(wire.TypeGet, item("k", sa, 0, obj))
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the get did not promote k")
	}
	m, err := b.call(wire.TypeRemove, wire.Remove{Keys: []string{"k"}})
	if err != nil || m.(*wire.RemoveReply).Removed != 1 {
		t.Fatalf("remove during the promotion: %+v %v", m, err)
	}
	releaseOnce()
	if res := await(t, "the promoting get", got); res[0].Status != wire.OK {
		t.Fatalf("the promoting get: %+v", res[0]) // it read the object before the remove: a hit
	} else if stamped(mem[:obj], "k", 0) != 0 {
		t.Fatal("the promoting get served other bytes")
	}
	if res := a.batch(wire.TypeGet, item("k", sa, 0, obj)); res[0].Status == wire.OK {
		t.Fatal("a key removed during its promotion reads back")
	}
	if st := s.Stats(); st.Arena.RemovedWhileWritten != 1 || st.Ops.Promotions != 0 {
		t.Fatalf("removed while written %d, promotions %d; want 1, 0", st.Arena.RemovedWhileWritten, st.Ops.Promotions)
	}
}

// waitEvictionsDone waits (bounded) until no eviction is in flight and the
// arena is at or below its high watermark.
func waitEvictionsDone(t *testing.T, s *Server) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		st := s.arena.Stats()
		if float64(st.HeldBytes) <= 0.9*float64(st.SizeBytes) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("evictions did not settle: %+v", st)
		}
		time.Sleep(time.Millisecond)
	}
}

// A Remove that lands while the write-through to Redis is sending the object
// must win as well: it waits for the write, then removes the key from Redis, so
// no node finds it there afterwards. It used to remove it from Redis first,
// and the write then stored it again.
func TestRemoveWaitsForAWriteThroughInFlight(t *testing.T) {
	redis := redistest.Start(t)
	held, release := make(chan struct{}), make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	var armed atomic.Bool
	armed.Store(true)
	a := start(t, func(c *Config) {
		c.RemoteAddrs = []string{redis.Addr()}
		c.hooks = &hooks{writingThrough: func(keys []string) {
			if slices.Contains(keys, "k") && armed.CompareAndSwap(true, false) {
				close(held)
				<-release
			}
		}}
	})
	t.Cleanup(releaseOnce)
	b := start(t, func(c *Config) { c.RemoteAddrs = []string{redis.Addr()} })
	waitRemoteConnected(t, a)
	waitRemoteConnected(t, b)
	ca, cr := dial(t, a), dial(t, a)
	_, sa := ca.segment(1 << 20)
	if res := ca.batch(wire.TypePut, item("k", sa, 0, 4096)); res[0].Status != wire.OK {
		t.Fatalf("put: %+v", res[0])
	}
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the put was not written through")
	}
	removed := make(chan error, 1)
	go func() {
		m, err := send(cr.conn, 1000, wire.TypeRemove, wire.Remove{Keys: []string{"k"}})
		if err == nil && m.(*wire.RemoveReply).Removed != 1 {
			err = fmt.Errorf("removed %d, want 1", m.(*wire.RemoveReply).Removed)
		}
		removed <- err
	}()
	// The remove takes k out of the arena first; hold the write until then.
	for deadline := time.Now().Add(10 * time.Second); a.arena.Contains("k", 7); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the remove did not take k out of the arena")
		}
	}
	releaseOnce()
	select {
	case err := <-removed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the remove did not answer")
	}
	cb := dial(t, b)
	_, sb := cb.segment(1 << 20)
	if res := cb.batch(wire.TypeGet, item("k", sb, 0, 4096)); res[0].Status == wire.OK {
		t.Fatal("another node finds a removed key in Redis")
	}
}
