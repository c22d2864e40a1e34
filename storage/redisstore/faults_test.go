package redisstore

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/stratakv/strata/internal/redistest"
	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
	"github.com/stratakv/strata/storage/storagetest"
)

const kv = pagekey.TargetPool

// pagesFixture is a store's registered target pool of 2n pages, with pages
// 0..n-1 filled with logical pages 0..n-1, and n keys.
type pagesFixture struct {
	s    *Store
	spec storage.PoolSpec
	keys []pagekey.Key
	src  []pool.PageID
	dst  []pool.PageID
}

func newPagesFixture(t *testing.T, s *Store, n int) *pagesFixture {
	t.Helper()
	g := storagetest.NewGroupPages(t, s, kvlayout.PageFirst, storagetest.PageSize, 2*n, []pool.PoolSpec{{Name: kv, Geometry: storagetest.TargetGeometry}})
	storagetest.Register(t, s, g)
	f := &pagesFixture{s: s, spec: g.Spec(kv), keys: storagetest.Keys(t, 77, n)}
	for i := 0; i < n; i++ {
		storagetest.Fill(f.spec, pool.PageID(i), i, 0)
		f.src = append(f.src, pool.PageID(i))
		f.dst = append(f.dst, pool.PageID(n+i))
	}
	return f
}

func (f *pagesFixture) putAll(t *testing.T) {
	t.Helper()
	for i, err := range f.s.Put(bg, kv, f.keys, f.src) {
		if err != nil {
			t.Fatalf("put key %d: %v", i, err)
		}
	}
}

// checkGet fails t unless key i's result is a hit with the right bytes where
// wantHit says so, and matches fault otherwise.
func (f *pagesFixture) checkGet(t *testing.T, errs []error, wantHit func(i int) bool, fault func(error) bool, what string) {
	t.Helper()
	for i, err := range errs {
		if wantHit(i) {
			if err != nil {
				t.Fatalf("%s: key %d: %v", what, i, err)
			}
			if cerr := storagetest.Check(f.spec, f.dst[i], i, 0); cerr != nil {
				t.Fatalf("%s: %v", what, cerr)
			}
			continue
		}
		if !fault(err) {
			t.Fatalf("%s: key %d: %v", what, i, err)
		}
	}
}

func isDown(err error) bool {
	return errors.Is(err, storage.ErrUnavailable) || errors.Is(err, storage.ErrTimeout)
}

// slack is what a busy machine running -race may add to a call that should end
// at its timeout: generous, since the failures these bounds catch are calls
// that never end (the store turns go-redis's read timeouts off).
const slack = 3 * time.Second

// TestDeadMaster kills one master of three: its keys fail fast with
// ErrUnavailable (or ErrTimeout) while the others are served, then it comes back.
// The store's clock stands still until the test advances it, so the dead shard
// stays skipped however slowly the test runs.
func TestDeadMaster(t *testing.T) {
	if testing.Short() {
		t.Skip("forms a Redis Cluster")
	}
	c := redistest.StartCluster(t, 3)
	standalone := testConfig(t, c.Addrs()[0])
	standalone.Mode = ModeStandalone
	if _, err := New(bg, standalone); !errors.Is(err, storage.ErrConfig) {
		t.Fatalf("standalone mode on a cluster node: %v, want ErrConfig", err)
	}
	clock := newTestClock()
	cfg := testConfig(t, c.Addrs()...)
	cfg.CallTimeout = 5 * time.Second
	cfg.Backoff = 200 * time.Millisecond
	cfg.now = clock.Now
	s := newStore(t, cfg)
	f := newPagesFixture(t, s, 100)
	f.putAll(t)
	victim := c.Nodes()[1]
	// A key is on the victim when one of its parts (K, V) is.
	onVictim := make([]bool, len(f.keys))
	n := 0
	for i, k := range f.keys {
		for _, name := range storage.ObjectNames(f.spec, k) {
			sh, err := s.shardOf(bg, name)
			if err != nil {
				t.Fatal(err)
			}
			if sh.addr == victim.Addr() {
				onVictim[i] = true
			}
		}
		if onVictim[i] {
			n++
		}
	}
	if n == 0 || n == len(f.keys) {
		t.Fatalf("%d of %d keys on the victim: the keys are not spread", n, len(f.keys))
	}
	live := func(i int) bool { return !onVictim[i] }
	f.checkGet(t, s.Get(bg, kv, f.keys, f.dst), func(int) bool { return true }, nil, "get before the kill")

	victim.Kill()
	start := time.Now()
	errs := s.Get(bg, kv, f.keys, f.dst)
	if d := time.Since(start); d > cfg.CallTimeout+slack {
		t.Fatalf("get with a dead master took %v, the call timeout is %v", d, cfg.CallTimeout)
	}
	f.checkGet(t, errs, live, isDown, "get with a dead master")
	// Now the shard is skipped: its keys fail fast, the others are still served.
	errs = s.Get(bg, kv, f.keys, f.dst)
	f.checkGet(t, errs, live, func(err error) bool { return errors.Is(err, storage.ErrUnavailable) }, "get with the dead master skipped")
	st := s.Stats()
	if st.Skipped == 0 {
		t.Fatalf("no object skipped while its shard is down: %+v", st)
	}
	for _, sh := range st.Shards {
		if (sh.Addr == victim.Addr()) == sh.Up {
			t.Fatalf("shard states (victim %s): %+v", victim.Addr(), st.Shards)
		}
	}
	if _, err := s.Exists(bg, kv, f.keys); err != nil && !isDown(err) {
		t.Fatalf("Exists with a dead master: %v", err)
	}

	victim.Restart(t)
	c.WaitOK(t, 30*time.Second)
	// The restarted master has lost its data (no persistence); its keys are served
	// again once the client reconnects and the backoff ends: hits or misses, no faults.
	deadline := time.Now().Add(30 * time.Second)
	for {
		// Past the longest backoff (10 times Backoff): the shard is tried again.
		clock.Advance(10*cfg.Backoff + time.Millisecond)
		errs := s.Get(bg, kv, f.keys, f.dst)
		faults := 0
		for _, err := range errs {
			if err != nil && !errors.Is(err, storage.ErrNotFound) {
				faults++
			}
		}
		if faults == 0 {
			f.checkGet(t, errs, live, func(err error) bool { return errors.Is(err, storage.ErrNotFound) }, "get after the restart")
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys still fault 30 s after the master came back: %v", faults, s.Stats().Shards)
		}
		time.Sleep(100 * time.Millisecond)
	}
	f.putAll(t)
	f.checkGet(t, s.Get(bg, kv, f.keys, f.dst), func(int) bool { return true }, nil, "get after putting again")
	for _, sh := range s.Stats().Shards {
		if !sh.Up {
			t.Fatalf("shard %s still down: %+v", sh.Addr, sh)
		}
	}
}

// TestServerDownAndHung covers a standalone server that dies (ErrUnavailable,
// then fast misses, then back after a restart) and one that stops answering
// (ErrTimeout within the call timeout). The stores' clock stands still until
// the test advances it, so a shard that failed stays skipped however slowly the
// test runs.
func TestServerDownAndHung(t *testing.T) {
	srv := redistest.Start(t)
	clock := newTestClock()
	cfg := testConfig(t, srv.Addr())
	cfg.now = clock.Now
	s := newStore(t, cfg)
	f := newPagesFixture(t, s, 8)
	f.putAll(t)
	none := func(int) bool { return false }
	all := func(int) bool { return true }

	srv.Kill()
	f.checkGet(t, s.Get(bg, kv, f.keys, f.dst), none, func(err error) bool { return errors.Is(err, storage.ErrUnavailable) }, "get from a dead server")
	f.checkGet(t, s.Put(bg, kv, f.keys, f.src), none, func(err error) bool { return errors.Is(err, storage.ErrUnavailable) }, "put to a dead server")
	if _, err := s.Exists(bg, kv, f.keys); !errors.Is(err, storage.ErrUnavailable) {
		t.Fatalf("Exists on a dead server: %v", err)
	}
	if st := s.Stats(); st.Skipped == 0 || st.Shards[0].Up || st.Faults["unavailable"] == 0 {
		t.Fatalf("stats with the server down: %+v", st)
	}
	srv.Restart(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		clock.Advance(10*cfg.Backoff + time.Millisecond) // past any backoff
		n, err := s.Exists(bg, kv, f.keys)
		if err == nil && n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Exists after the restart: %d, %v", n, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.putAll(t)
	f.checkGet(t, s.Get(bg, kv, f.keys, f.dst), all, nil, "get after the restart")

	// A server that stops answering: calls end at the call timeout. A store of
	// its own has the short timeout, so that the calls above, which must
	// succeed, have the long one.
	hcfg := testConfig(t, srv.Addr())
	hcfg.CallTimeout = 300 * time.Millisecond
	hcfg.now = clock.Now
	hs := newStore(t, hcfg)
	hf := newPagesFixture(t, hs, 8) // the same keys and pages: it reads what f put
	if err := syscall.Kill(srv.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(srv.PID(), syscall.SIGCONT) })
	start := time.Now()
	errs := hs.Get(bg, kv, hf.keys, hf.dst)
	if d := time.Since(start); d > hcfg.CallTimeout+slack {
		t.Fatalf("get from a hung server took %v, the call timeout is %v", d, hcfg.CallTimeout)
	}
	hf.checkGet(t, errs, none, func(err error) bool { return errors.Is(err, storage.ErrTimeout) }, "get from a hung server")
	if st := hs.Stats(); st.Shards[0].Up || st.Shards[0].Failures != 1 {
		t.Fatalf("a shard that timed out is not skipped: %+v", st.Shards)
	}
	// The caller's own deadline is not the server's fault: no backoff for it.
	_ = syscall.Kill(srv.PID(), syscall.SIGCONT)
	clock.Advance(10*hcfg.Backoff + time.Millisecond) // past the timeout's backoff
	expired, cancel := context.WithDeadline(bg, time.Now().Add(-time.Second))
	defer cancel()
	hf.checkGet(t, hs.Get(expired, kv, hf.keys, hf.dst), none, func(err error) bool { return errors.Is(err, storage.ErrTimeout) }, "get with an expired context")
	if st := hs.Stats(); !st.Shards[0].Up || st.Shards[0].Failures != 1 {
		t.Fatalf("the caller's expired context counted against the shard: %+v", st.Shards)
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		errs := hs.Get(bg, kv, hf.keys, hf.dst)
		if errs[0] == nil {
			hf.checkGet(t, errs, all, nil, "get after the server resumed")
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("get after the server resumed: %v", errs[0])
		}
		// A call that timed out while the server caught up backs the shard off again.
		clock.Advance(10*hcfg.Backoff + time.Millisecond)
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLayoutsShareObjects reads objects written by a layer-first pool through a
// page-first-direct pool of the same format, and back: the reader follows the
// writer's cut (a second round trip), straight into its run or staged across runs.
func TestLayoutsShareObjects(t *testing.T) {
	srv := redistest.Start(t)
	// 2 KiB per token and layer, 32 tokens a page: 64 KiB layer runs, chunks of
	// their own in the layer-first pool.
	geo := kvlayout.Geometry{Layers: 2, KVHeads: 8, HeadDim: 128, DTypeBytes: 2}
	pools := []pool.PoolSpec{{Name: kv, Geometry: geo}}
	lf, pd := newStore(t, testConfig(t, srv.Addr())), newStore(t, testConfig(t, srv.Addr()))
	glf := storagetest.NewGroupPages(t, lf, kvlayout.LayerFirst, 32, 4, pools)
	gpd := storagetest.NewGroupPages(t, pd, kvlayout.PageFirstDirect, 32, 4, pools)
	storagetest.Register(t, lf, glf)
	storagetest.Register(t, pd, gpd)
	slf, spd := glf.Spec(kv), gpd.Spec(kv)
	if storage.FormatOf(slf.Layout) != storage.FormatOf(spd.Layout) {
		t.Skip("layer-first and page-first-direct pools no longer share a format")
	}
	keys := storagetest.Keys(t, 5, 4)
	for i := 0; i < 2; i++ {
		storagetest.Fill(slf, pool.PageID(i), i, 0)
		storagetest.Fill(spd, pool.PageID(i), 2+i, 0)
	}
	expect := func(errs []error) {
		t.Helper()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("key %d: %v", i, err)
			}
		}
	}
	expect(lf.Put(bg, kv, keys[:2], []pool.PageID{0, 1}))
	expect(pd.Put(bg, kv, keys[2:], []pool.PageID{0, 1}))
	expect(pd.Get(bg, kv, keys[:2], []pool.PageID{2, 3}))
	expect(lf.Get(bg, kv, keys[2:], []pool.PageID{2, 3}))
	for i := 0; i < 2; i++ {
		if err := storagetest.Check(spd, pool.PageID(2+i), i, 0); err != nil {
			t.Fatalf("page-first-direct reading layer-first: %v", err)
		}
		if err := storagetest.Check(slf, pool.PageID(2+i), 2+i, 0); err != nil {
			t.Fatalf("layer-first reading page-first-direct: %v", err)
		}
	}
	if st := pd.Stats(); st.Replans != 4 || st.Staged != 0 {
		t.Fatalf("page-first-direct reader: %d replans, %d staged chunks; want 4 and 0", st.Replans, st.Staged)
	}
	if st := lf.Stats(); st.Replans != 4 || st.Staged != 4 {
		t.Fatalf("layer-first reader: %d replans, %d staged chunks; want 4 and 4", st.Replans, st.Staged)
	}
	if n, err := lf.Exists(bg, kv, keys); n != 4 || err != nil {
		t.Fatalf("Exists across layouts = %d, %v", n, err)
	}
}
