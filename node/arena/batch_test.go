package arena

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// TestAcquireIntoMatchesAcquire checks that a batch lease (AcquireInto,
// ReleaseAll) does what one Acquire and Release per key does: the same leases,
// the same errors (a missing key, one being written, one in another format, a
// key twice), the same bytes, and the same counters and LRU order afterwards,
// on two arenas given the same objects.
func TestAcquireIntoMatchesAcquire(t *testing.T) {
	one := newArena(t, testConfig(t, 1<<20))
	batch := newArena(t, testConfig(t, 1<<20))
	for _, a := range []*Arena{one, batch} {
		put(t, a, "a", 1, 100)
		put(t, a, "b", 1, 5000)
		put(t, a, "c", 2, 300) // another format
		put(t, a, "d", 1, 1)
		if _, err := a.Reserve("pending", 1, 10); err != nil { // never committed
			t.Fatal(err)
		}
	}
	keys := []string{"a", "missing", "b", "c", "pending", "a", "d"}
	var single []*Lease
	var singleErrs []error
	for _, k := range keys {
		l, err := one.Acquire(k, 1)
		single, singleErrs = append(single, l), append(singleErrs, err)
	}
	leases := make([]Lease, len(keys))
	errs := make([]error, len(keys))
	if err := batch.AcquireInto(keys, 1, leases, errs); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if (singleErrs[i] == nil) != (errs[i] == nil) ||
			errors.Is(singleErrs[i], ErrNotFound) != errors.Is(errs[i], ErrNotFound) ||
			errors.Is(singleErrs[i], ErrFormat) != errors.Is(errs[i], ErrFormat) {
			t.Fatalf("%s: Acquire says %v, AcquireInto %v", k, singleErrs[i], errs[i])
		}
		if errs[i] != nil {
			if leases[i].Bytes() != nil {
				t.Fatalf("%s: a failed batch lease has bytes", k)
			}
			continue
		}
		if leases[i].Key() != k || !bytes.Equal(leases[i].Bytes(), single[i].Bytes()) {
			t.Fatalf("%s: the batch lease holds %q with other bytes than Acquire's", k, leases[i].Key())
		}
	}
	if s1, s2 := one.Stats(), batch.Stats(); s1.Leases != s2.Leases || s1.LeasedObjects != s2.LeasedObjects || s2.Leases != 4 || s2.LeasedObjects != 3 {
		t.Fatalf("leases: one by one %d on %d objects, batch %d on %d; want 4 on 3", s1.Leases, s1.LeasedObjects, s2.Leases, s2.LeasedObjects)
	}
	// Released in the same order, the objects go back on the LRU list in the
	// same order: the same victims are evicted first.
	single[5].Release()
	for _, l := range single {
		if l != nil {
			l.Release() // single[5] again: idempotent
		}
	}
	leases[5].Release() // one of a batch on its own: ReleaseAll must skip it
	leases[5].Release()
	batch.ReleaseAll(leases)
	batch.ReleaseAll(leases) // idempotent
	for _, a := range []*Arena{one, batch} {
		if st := a.Stats(); st.Leases != 0 || st.LeasedObjects != 0 {
			t.Fatalf("after release: %d leases on %d objects", st.Leases, st.LeasedObjects)
		}
		mustCheck(t, a)
	}
	if o1, o2 := lruOrder(one), lruOrder(batch); fmt.Sprint(o1) != fmt.Sprint(o2) {
		t.Fatalf("LRU order: one by one %v, batch %v", o1, o2)
	}
	for i := range leases {
		if leases[i].Bytes() != nil || leases[i].Key() != "" {
			t.Fatalf("%s: bytes or key %q after ReleaseAll", keys[i], leases[i].Key())
		}
	}
	// The slices are reused for the next batch.
	if err := batch.AcquireInto([]string{"missing", "d"}, 1, leases, errs); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(errs[0], ErrNotFound) || errs[1] != nil || !bytes.Equal(leases[1].Bytes(), pattern("d", 1)) {
		t.Fatalf("reused slices: errors %v, %v", errs[0], errs[1])
	}
	batch.ReleaseAll(leases[:2])
	if st := batch.Stats(); st.Leases != 0 {
		t.Fatalf("%d leases after reuse", st.Leases)
	}
}

// lruOrder lists the keys on a's LRU list, most recently used first.
func lruOrder(a *Arena) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var keys []string
	for idx := a.rec(0).next; idx != 0; idx = a.rec(idx).next {
		keys = append(keys, a.keyString(a.rec(idx)))
	}
	return keys
}

// TestBatchLeaseOfRemovedObject: an object removed while a batch leases it
// keeps its bytes until ReleaseAll, which frees it.
func TestBatchLeaseOfRemovedObject(t *testing.T) {
	a := newArena(t, testConfig(t, 1<<20))
	put(t, a, "k", 1, 8192)
	put(t, a, "j", 1, 4096)
	leases := make([]Lease, 3)
	errs := make([]error, 3)
	if err := a.AcquireInto([]string{"k", "j", "k"}, 1, leases, errs); err != nil || errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatalf("acquire: %v %v", err, errs)
	}
	if !a.Remove("k") || a.Contains("k", 1) {
		t.Fatal("remove of a leased object failed")
	}
	put(t, a, "k", 1, 4096) // the key can be written again meanwhile
	if !bytes.Equal(leases[0].Bytes(), pattern("k", 8192)) || !bytes.Equal(leases[2].Bytes(), pattern("k", 8192)) {
		t.Fatal("leased bytes changed after Remove")
	}
	if st := a.Stats(); st.UsedBytes != 8192+2*4096+descSlab || st.Leases != 3 || st.LeasedObjects != 2 {
		t.Fatalf("stats with a removed, leased object: %+v", st)
	}
	mustCheck(t, a)
	a.ReleaseAll(leases)
	if st := a.Stats(); st.UsedBytes != 2*4096+descSlab || st.Leases != 0 || st.LeasedObjects != 0 {
		t.Fatalf("stats after ReleaseAll: %+v", st)
	}
	read(t, a, "k", 1, 4096)
	mustCheck(t, a)
}

// TestBatchLeaseAcrossClose: AcquireInto on a closed arena leases nothing, and
// a batch leased before Close keeps the memory mapped until ReleaseAll.
func TestBatchLeaseAcrossClose(t *testing.T) {
	a, err := New(testConfig(t, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	put(t, a, "k", 1, 5000)
	put(t, a, "s", 1, 100) // a slab object
	leases := make([]Lease, 2)
	errs := make([]error, 2)
	if err := a.AcquireInto([]string{"k", "s"}, 1, leases, errs); err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("acquire: %v %v", err, errs)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(leases[0].Bytes(), pattern("k", 5000)) || !bytes.Equal(leases[1].Bytes(), pattern("s", 100)) {
		t.Fatal("leased bytes changed at Close")
	}
	more := make([]Lease, 2)
	if err := a.AcquireInto([]string{"k", "s"}, 1, more, errs); !errors.Is(err, ErrClosed) {
		t.Fatalf("AcquireInto after close: %v", err)
	}
	a.ReleaseAll(more) // nothing to release
	if st := a.Stats(); st.Leases != 2 {
		t.Fatalf("%d leases after a failed AcquireInto; want the 2 taken before Close", st.Leases)
	}
	a.ReleaseAll(leases)
	a.mu.Lock()
	unmapped := a.back == nil
	a.mu.Unlock()
	if !unmapped {
		t.Fatal("memory still mapped after ReleaseAll of the last leases")
	}
}

// TestBatchLeasesUnderEviction runs batch readers against writers and removers
// in an arena too small for what is written, so that eviction runs all the
// time: every leased object must keep its bytes until released, and the arena's
// invariants must hold at the end.
func TestBatchLeasesUnderEviction(t *testing.T) {
	a := newArena(t, testConfig(t, 256<<10))
	const keys = 64
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	report := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	for w := range 2 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range 2000 {
				key := fmt.Sprintf("key-%d", rng.IntN(keys))
				switch rng.IntN(10) {
				case 0:
					a.Remove(key)
				default:
					p, err := a.Reserve(key, 1, int64(512+len(key)*97%3000))
					if err != nil {
						continue // exists, or no room: both fine here
					}
					copy(p.Bytes(), pattern(key, len(p.Bytes())))
					if err := p.Commit(); err != nil && !errors.Is(err, ErrRemoved) {
						report(fmt.Errorf("commit %s: %v", key, err))
						return
					}
				}
			}
		})
	}
	for r := range 2 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 2))
			leases := make([]Lease, 16)
			errs := make([]error, 16)
			batch := make([]string, 16)
			for range 500 {
				for i := range batch {
					batch[i] = fmt.Sprintf("key-%d", rng.IntN(keys))
				}
				if err := a.AcquireInto(batch, 1, leases, errs); err != nil {
					report(err)
					return
				}
				for i := range batch {
					if errs[i] != nil {
						if !errors.Is(errs[i], ErrNotFound) {
							report(fmt.Errorf("%s: %v", batch[i], errs[i]))
						}
						continue
					}
					if b := leases[i].Bytes(); !bytes.Equal(b, pattern(batch[i], len(b))) {
						report(fmt.Errorf("%s: leased bytes differ from the written", batch[i]))
					}
				}
				if rng.IntN(2) == 0 {
					leases[0].Release() // mixed with single releases
				}
				a.ReleaseAll(leases)
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	if st := a.Stats(); st.Leases != 0 || st.LeasedObjects != 0 {
		t.Fatalf("%d leases on %d objects left", st.Leases, st.LeasedObjects)
	}
	mustCheck(t, a)
}

// ReserveInto across Close, as AcquireInto: Pendings reserved before Close
// end as a Commit of each would (ErrClosed, nothing stored, the memory given
// back once they end); a ReserveInto after it fails as a whole and reserves
// nothing; and the elements that hold nothing can be committed (ErrDone) and
// aborted without harm.
func TestReserveIntoAcrossClose(t *testing.T) {
	a, err := New(testConfig(t, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	keys, formats, sizes := []string{"k", "s", ""}, []uint64{1, 1, 1}, []int64{5000, 100, 10}
	ps, errs := make([]Pending, 3), make([]error, 3)
	if err := a.ReserveInto(keys, formats, sizes, ps, errs); err != nil || errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], ErrKey) {
		t.Fatalf("reserve: %v %v", err, errs)
	}
	if err := ps[2].Commit(); !errors.Is(err, ErrDone) {
		t.Fatalf("Commit of an element that holds nothing: %v, want ErrDone", err)
	}
	ps[2].Abort()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	more, merrs := make([]Pending, 1), make([]error, 1)
	if err := a.ReserveInto([]string{"late"}, []uint64{1}, []int64{100}, more, merrs); !errors.Is(err, ErrClosed) {
		t.Fatalf("ReserveInto after Close: %v, want ErrClosed", err)
	}
	more[0].Abort() // holds nothing
	cerrs := make([]error, 3)
	if err := a.CommitAll(ps, cerrs); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(cerrs[0], ErrClosed) || !errors.Is(cerrs[1], ErrClosed) || !errors.Is(cerrs[2], ErrDone) {
		t.Fatalf("CommitAll after Close: %v", cerrs)
	}
	a.mu.Lock()
	unmapped := a.back == nil
	a.mu.Unlock()
	if !unmapped {
		t.Fatal("memory still mapped after the last Pendings ended")
	}
}
