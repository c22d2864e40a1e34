package file

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// Exists reports how many of keys, from the start, have every part of their object
// stored in the pool's format. It reads each part's header; a corrupt one is
// removed and counts as missing.
func (s *Store) Exists(ctx context.Context, poolName string, keys []pagekey.Key) (int, error) {
	ps, done, err := storage.Admit(s.begin, poolName, "exists", func(*poolState) error {
		if err := storage.CheckKeys(keys); err != nil {
			return fmt.Errorf("file store: exists in pool %q: %w", poolName, err)
		}
		return nil
	})
	if err != nil {
		s.stats.fault(err)
		return 0, err
	}
	defer done()
	n := len(keys)
	var firstMiss atomic.Int64
	firstMiss.Store(int64(n))
	missAt := func(i int) {
		for {
			cur := firstMiss.Load()
			if int64(i) >= cur || firstMiss.CompareAndSwap(cur, int64(i)) {
				return
			}
		}
	}
	found := make([]bool, n)
	errs := s.parallel(ctx, "exists", n, func(i int, b *ioBuf) error {
		if int64(i) > firstMiss.Load() {
			return nil // past a miss: the answer does not depend on it
		}
		for part := 0; part < ps.parts; part++ {
			name := ps.names.Object(keys[i], ps.spec.Name, part)
			rel := relPath(keys[i], name)
			have, err := s.probe(ps.obj(), rel, name, b)
			if err != nil || have != stored {
				missAt(i)
				return err
			}
		}
		found[i] = true
		return nil
	})
	for i := 0; i < n; i++ {
		if errs[i] != nil {
			s.stats.fault(errs[i])
			return i, errs[i]
		}
		if !found[i] {
			return i, nil
		}
	}
	return n, nil
}

// Get reads the objects of keys into the pool's pages: every part is opened, its
// header checked, its body read straight into the page's runs and its checksum
// verified over the bytes now in host memory. A part of another format is
// storage.ErrNotFound and stays; a part that fails a check is storage.ErrCorrupt
// and is removed.
func (s *Store) Get(ctx context.Context, poolName string, keys []pagekey.Key, pages []pool.PageID) []error {
	ps, done, err := storage.Admit(s.begin, poolName, "get", func(ps *poolState) error {
		if err := storage.CheckBatch(ps.spec, keys, pages); err != nil {
			return fmt.Errorf("file store: get from pool %q: %w", poolName, err)
		}
		return nil
	})
	if err != nil {
		return s.failAll(len(keys), err)
	}
	defer done()
	mem := ps.spec.Region.Bytes()
	errs := s.parallel(ctx, "get", len(keys)*ps.parts, func(i int, b *ioBuf) error {
		k, part := i/ps.parts, i%ps.parts
		return s.getPart(ps, keys[k], pages[k], part, mem, b)
	})
	return s.perKey(errs, len(keys), ps.parts)
}

// Put writes the pool's pages as the objects of keys, write-once: a part already
// stored (in any format) is left as it is and counts as a success.
func (s *Store) Put(ctx context.Context, poolName string, keys []pagekey.Key, pages []pool.PageID) []error {
	ps, done, err := storage.Admit(s.begin, poolName, "put", func(ps *poolState) error {
		if ps.readOnly != nil {
			return fmt.Errorf("file store: put to pool %q: %v; its registration failed: %w", poolName, ps.readOnly, storage.ErrNotRegistered)
		}
		if err := storage.CheckBatch(ps.spec, keys, pages); err != nil {
			return fmt.Errorf("file store: put to pool %q: %w", poolName, err)
		}
		return nil
	})
	if err != nil {
		return s.failAll(len(keys), err)
	}
	defer done()
	s.refresh()
	mem := ps.spec.Region.Bytes()
	// Renames are made durable once per subdirectory per batch rather than once per
	// object: a directory fsync costs about what a whole 4 MiB object write does.
	dirty := make([]string, len(keys)*ps.parts)
	errs := s.parallel(ctx, "put", len(keys)*ps.parts, func(i int, b *ioBuf) error {
		k, part := i/ps.parts, i%ps.parts
		var err error
		dirty[i], err = s.putPart(ps, keys[k], pages[k], part, mem, b)
		return err
	})
	if s.cfg.Sync {
		s.syncDirs(ctx, dirty, errs)
	}
	return s.perKey(errs, len(keys), ps.parts)
}

// begin admits a call on poolName: the store is open and the pool registered with
// live memory. The caller calls done when the call ends.
func (s *Store) begin(poolName, op string) (ps *poolState, done func(), err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, nil, fmt.Errorf("file store %s: %s: %w", s.dir, op, storage.ErrClosed)
	}
	ps = s.pools[poolName]
	if ps == nil {
		return nil, nil, fmt.Errorf("file store %s: %s on pool %q, which is not registered; call RegisterPool first: %w",
			s.dir, op, poolName, storage.ErrNotRegistered)
	}
	if ps.spec.Region.Closed() {
		return nil, nil, fmt.Errorf("file store %s: %s on pool %q, whose memory region was closed; register the pool's new memory: %w",
			s.dir, op, poolName, storage.ErrNotRegistered)
	}
	s.inflight.Add(1)
	return ps, s.inflight.Done, nil
}

// parallel runs fn for items 0..n-1 on up to IOWorkers goroutines, each with its
// own scratch buffers, checking ctx before each item.
func (s *Store) parallel(ctx context.Context, op string, n int, fn func(i int, b *ioBuf) error) []error {
	errs := make([]error, n)
	var next atomic.Int64
	work := func() {
		b := s.bufs.Get().(*ioBuf)
		defer s.bufs.Put(b)
		for {
			i := int(next.Add(1) - 1)
			if i >= n {
				return
			}
			if err := ctx.Err(); err != nil {
				errs[i] = ctxError(op, err)
				continue
			}
			errs[i] = fn(i, b)
		}
	}
	var wg sync.WaitGroup
	for w := 1; w < min(s.cfg.IOWorkers, n); w++ {
		wg.Go(work)
	}
	work()
	wg.Wait()
	return errs
}

// perKey folds the results of each key's parts into one: a fault outranks a miss.
func (s *Store) perKey(partErrs []error, keys, parts int) []error {
	out := make([]error, keys)
	for i, err := range partErrs {
		k := i / parts
		if out[k] == nil || (err != nil && errors.Is(out[k], storage.ErrNotFound) && !errors.Is(err, storage.ErrNotFound)) {
			out[k] = err
		}
	}
	s.stats.faultAll(out)
	return out
}

func (s *Store) failAll(n int, err error) []error {
	out := storage.FailAll(n, err)
	s.stats.faultAll(out)
	return out
}
