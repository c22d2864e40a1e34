package storagetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// testShared runs two backends over one store, as two engine processes.
func (s *suite) testShared(t *testing.T) {
	const shared = "shared-store"
	b1, b2 := s.backend(t, shared), s.backend(t, shared)
	g1 := NewGroup(t, b1, kvlayout.PageFirst, PageSize, mhaPools)
	g2 := NewGroup(t, b2, kvlayout.PageFirst, PageSize, mhaPools)
	Register(t, b1, g1)
	Register(t, b2, g2)
	keys := Keys(t, 7, 8)
	for _, p := range g1.Pools() {
		name := p.Name()
		s1, s2 := g1.Spec(name), g2.Spec(name)
		fillRange(s1, 0, 8, 0)
		fillRange(s2, 0, 8, 0)
		expectAll(t, "put through the first", b1.Put(bg, name, keys[:4], seq(0, 4)), 4)
		expectExists(t, b2, name, keys, 4)
		expectAll(t, "get through the second", b2.Get(bg, name, keys[:4], seq(20, 4)), 4)
		for i := 0; i < 4; i++ {
			if err := Check(s2, pool.PageID(20+i), i, 0); err != nil {
				t.Fatal(err)
			}
		}
		expectAll(t, "put through the second", b2.Put(bg, name, keys[4:], seq(4, 4)), 4)
		expectExists(t, b1, name, keys, 8)
		expectAll(t, "get through the first", b1.Get(bg, name, keys[4:], seq(30, 4)), 4)
		for i := 0; i < 4; i++ {
			if err := Check(s1, pool.PageID(30+i), 4+i, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Both put the same new keys at once: write-once across the two, no damage.
	more := Keys(t, 8, 8)
	var wg sync.WaitGroup
	results := make([][]error, 2)
	for i, b := range []storage.Backend{b1, b2} {
		wg.Go(func() { results[i] = b.Put(bg, pagekey.TargetPool, more, seq(0, 8)) })
	}
	wg.Wait()
	expectAll(t, "concurrent put through the first", results[0], 8)
	expectAll(t, "concurrent put through the second", results[1], 8)
	for i, b := range []storage.Backend{b1, b2} {
		g := []*Group{g1, g2}[i]
		expectAll(t, "get after concurrent puts", b.Get(bg, pagekey.TargetPool, more, seq(40, 8)), 8)
		for j := 0; j < 8; j++ {
			if err := Check(g.Spec(pagekey.TargetPool), pool.PageID(40+j), j, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func (s *suite) testContext(t *testing.T) {
	b, g := s.registered(t, "context", kvlayout.PageFirst, mhaPools)
	keys := Keys(t, 9, 4)
	name := pagekey.TargetPool
	spec := g.Spec(name)
	fillRange(spec, 0, 4, 0)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	isCanceled := func(err error) bool { return errors.Is(err, context.Canceled) || errors.Is(err, storage.ErrTimeout) }
	isExpired := func(err error) bool {
		return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, storage.ErrTimeout)
	}
	for _, c := range []struct {
		what  string
		ctx   context.Context
		match func(error) bool
	}{{"canceled", canceled, isCanceled}, {"expired", expired, isExpired}} {
		expectEach(t, "put with a "+c.what+" context", b.Put(c.ctx, name, keys, seq(0, 4)), 4, c.match, "the context's error")
		expectEach(t, "get with a "+c.what+" context", b.Get(c.ctx, name, keys, seq(10, 4)), 4, c.match, "the context's error")
		if _, err := b.Exists(c.ctx, name, keys); !c.match(err) {
			t.Fatalf("Exists with a %s context: %v, want the context's error", c.what, err)
		}
	}
	// Nothing half-done: every key is a clean miss or whole.
	for i, err := range b.Get(bg, name, keys, seq(20, 4)) {
		if err == nil {
			if cerr := Check(spec, pool.PageID(20+i), i, 0); cerr != nil {
				t.Fatal(cerr)
			}
		} else if !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("get after canceled calls, key %d: %v", i, err)
		}
	}
	expectAll(t, "put with a live context", b.Put(bg, name, keys, seq(0, 4)), 4)
	expectAll(t, "get with a live context", b.Get(bg, name, keys, seq(30, 4)), 4)
}

func (s *suite) testConcurrency(t *testing.T) {
	b, g := s.registered(t, "concurrency", kvlayout.PageFirst, mhaPools)
	const nkeys, workers, span = 16, 4, 6
	keys := Keys(t, 10, nkeys)
	for _, p := range g.Pools() {
		fillRange(g.Spec(p.Name()), 0, nkeys, 0)
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			dst := seq(nkeys+w*span, span) // pages only this worker reads into
			for round := 0; round < 3; round++ {
				first := (w*3 + round*2) % (nkeys - span + 1)
				for _, p := range g.Pools() {
					name, spec := p.Name(), g.Spec(p.Name())
					for i, err := range b.Put(bg, name, keys[first:first+span], seq(first, span)) {
						if err != nil {
							t.Errorf("worker %d put %s key %d: %v", w, name, first+i, err)
						}
					}
					for i, err := range b.Get(bg, name, keys[first:first+span], dst) {
						if err != nil {
							t.Errorf("worker %d get %s key %d: %v", w, name, first+i, err)
							continue
						}
						if cerr := Check(spec, dst[i], first+i, 0); cerr != nil {
							t.Errorf("worker %d: %v", w, cerr)
						}
					}
					if n, err := b.Exists(bg, name, keys[first:first+span]); err != nil || n != span {
						t.Errorf("worker %d: Exists = %d, %v; want %d", w, n, err, span)
					}
				}
			}
		})
	}
	wg.Wait()
}

func (s *suite) testClose(t *testing.T) {
	b, g := s.registered(t, "close", kvlayout.PageFirst, mhaPools)
	keys := Keys(t, 11, 2)
	name := pagekey.TargetPool
	fillRange(g.Spec(name), 0, 2, 0)
	expectAll(t, "put", b.Put(bg, name, keys, seq(0, 2)), 2)
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := b.Close(); err != nil && !errors.Is(err, storage.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	isClosed := is(storage.ErrClosed)
	expectEach(t, "put after Close", b.Put(bg, name, keys, seq(0, 2)), 2, isClosed, "ErrClosed")
	expectEach(t, "get after Close", b.Get(bg, name, keys, seq(4, 2)), 2, isClosed, "ErrClosed")
	if _, err := b.Exists(bg, name, keys); !errors.Is(err, storage.ErrClosed) {
		t.Fatalf("Exists after Close: %v, want ErrClosed", err)
	}
	if err := b.RegisterPool(bg, g.Spec(pagekey.DraftPool)); !errors.Is(err, storage.ErrClosed) {
		t.Fatalf("RegisterPool after Close: %v, want ErrClosed", err)
	}
}
