package hicache

import (
	"sync/atomic"
	"testing"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/storage"
)

// emptyingBackend is a memBackend that can lose everything it stores at once,
// as a node service restarting cold does, and says so (storage.ContentTracker).
type emptyingBackend struct {
	*memBackend
	epoch atomic.Uint64
}

var _ storage.ContentTracker = (*emptyingBackend)(nil)

func (b *emptyingBackend) ContentEpoch() uint64 { return b.epoch.Load() }

// empty drops every object and moves the content epoch.
func (b *emptyingBackend) empty() {
	b.mu.Lock()
	clear(b.objects)
	b.mu.Unlock()
	b.epoch.Add(1)
}

// A backend that comes back emptied gets what the cache still holds in L2
// backed up again, so that another engine finds those prefixes in L3 as before;
// without the refill they stayed lost until computed again.
func TestAnEmptiedBackendIsRefilledFromL2(t *testing.T) {
	backend := &emptyingBackend{memBackend: newMemBackend()}
	a, b := seq(1, 10*testPS), seq(2, 6*testPS)
	e := newEnvWith(t, l3Config(), 32, 64, Options{Storage: backend}, hostmem.Mmap)
	e.serve(t, a)
	e.serve(t, b)
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	before := e.cache.Stats().L3.BackedUpTokens
	if before != 16*testPS {
		t.Fatalf("backed up %d tokens, want %d", before, 16*testPS)
	}
	backend.empty()
	// Any call into the cache notices; Sync waits for the backups it queued.
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	st := e.cache.Stats().L3
	if st.Refills != 1 || st.RefillPages != 16 || st.BackedUpTokens != 2*before {
		t.Fatalf("after the backend emptied: refills %d, refill pages %d, backed up %d tokens (want 1, 16, %d)", st.Refills, st.RefillPages, st.BackedUpTokens, 2*before)
	}
	// Another engine finds both prefixes in L3 again, every byte checked.
	other := newEnvWith(t, l3Config(), 32, 64, Options{Storage: backend}, hostmem.Mmap)
	for _, s := range [][]uint32{a, b} {
		if r := other.serveWith(t, s, pagekey.Namespace{}); r.L3Tokens != len(s) {
			t.Fatalf("after the refill another engine hit %d of %d tokens in L3", r.L3Tokens, len(s))
		}
	}
	// A warm restart (the epoch does not move) costs nothing.
	if err := e.cache.Sync(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if st := e.cache.Stats().L3; st.Refills != 1 {
		t.Fatalf("refills %d without the backend emptying again", st.Refills)
	}
	e.checkTree(t)
}
