package file

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/storage"
	"github.com/stratakv/strata/storage/storagetest"
)

// objectBytes is what one kv object of the fixture takes on disk: two parts of a
// 4 KiB body and a 4 KiB header.
const objectBytes = 2 * (headerSize + 4096)

func TestLeastRecentlyUsedGoFirst(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, nil)
	cfg.CapacityBytes = 3 * objectBytes
	f := newFixture(t, cfg, mhaPools)
	for i := 0; i < 3; i++ {
		f.put(kv, i)
	}
	if errs := f.get(kv, 0); errs[0] != nil {
		t.Fatal(errs[0])
	}
	f.put(kv, 3)
	f.put(kv, 4)
	for i, want := range []int{1, 0, 0, 1, 1} {
		if n := f.exists(kv, i); n != want {
			t.Errorf("key %d: Exists = %d, want %d", i, n, want)
		}
	}
	st := f.s.Stats()
	if st.Bytes != 3*objectBytes || st.Files != 6 || st.Evictions != 4 {
		t.Fatalf("stats: %d bytes in %d files after %d evictions; want %d, 6, 4", st.Bytes, st.Files, st.Evictions, 3*objectBytes)
	}
	if objects, _ := walk(t, dir); len(objects) != 6 {
		t.Fatalf("%d files on disk, want 6", len(objects))
	}
	for i, err := range f.get(kv, 0, 3, 4) {
		if err != nil {
			t.Fatalf("get %d: %v", i, err)
		}
	}
}

// Another process's files count: a store that did not write them finds them by
// rescanning when its own view fills up, and evicts the oldest.
func TestRescanSeesOtherWriters(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, nil)
	cfg.CapacityBytes = 4 * objectBytes
	late := newFixture(t, cfg, mhaPools) // opened before the other writes: its scan saw nothing
	late.s.rescanEvery = 0
	early := newFixture(t, cfg, mhaPools)
	for i := 0; i < 4; i++ {
		early.put(kv, i)
	}
	time.Sleep(2 * time.Millisecond) // distinct times, whatever the clock's grain
	for i := 4; i < 8; i++ {
		late.put(kv, i) // the directory is past capacity, but late does not know
	}
	if late.s.Stats().Rescans != 0 {
		t.Fatal("rescan before the store's own view reached the capacity")
	}
	late.put(kv, 8) // passes capacity in late's view: rescan, then evict the oldest
	objects, _ := walk(t, dir)
	if got := int64(len(objects)) * objectBytes / 2; got > cfg.CapacityBytes {
		t.Fatalf("%d bytes on disk past a capacity of %d", got, cfg.CapacityBytes)
	}
	if late.s.Stats().Rescans == 0 {
		t.Fatal("no rescan")
	}
	for i, want := range []int{0, 0, 0, 0, 0, 1, 1, 1, 1} {
		if n := late.exists(kv, i); n != want {
			t.Errorf("key %d: Exists = %d, want %d", i, n, want)
		}
	}
	// A store opened now learns everything from its scan.
	fresh := newStore(t, cfg)
	if got, want := fresh.Stats().Files, int64(len(objects)); got != want {
		t.Fatalf("a new store counts %d files, the directory has %d", got, want)
	}
}

// A put refreshes a stale view in the background.
func TestPutRefreshesAStaleView(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, nil)
	late := newFixture(t, cfg, mhaPools)
	early := newFixture(t, cfg, mhaPools)
	early.put(kv, 0, 1, 2)
	late.s.refreshEvery = 0
	late.put(kv, 3)
	deadline := time.Now().Add(5 * time.Second)
	for late.s.Stats().Files != 8 {
		if time.Now().After(deadline) {
			t.Fatalf("the view has %d files after a refresh, the directory 8", late.s.Stats().Files)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestTwoStoresPutTheSameKeys(t *testing.T) {
	dir := t.TempDir()
	a := newFixture(t, testConfig(dir, nil), mhaPools)
	b := newFixture(t, testConfig(dir, nil), mhaPools)
	idx := make([]int, 16)
	for i := range idx {
		idx[i] = i
	}
	var wg sync.WaitGroup
	for _, f := range []*fixture{a, b} {
		for _, p := range []string{kv, "draft"} {
			wg.Go(func() {
				for i, err := range f.s.Put(bg, p, f.pick(idx), pages(idx)) {
					if err != nil {
						t.Errorf("put %s key %d: %v", p, i, err)
					}
				}
			})
		}
	}
	wg.Wait()
	objects, temps := walk(t, dir)
	if len(temps) != 0 {
		t.Fatalf("temporary files left: %v", temps)
	}
	if len(objects) != 2*2*16 {
		t.Fatalf("%d object files, want %d", len(objects), 2*2*16)
	}
	sa, sb := a.s.Stats(), b.s.Stats()
	if w := sa.Writes + sb.Writes; w != 64 {
		t.Fatalf("%d parts written by the two stores, want each of 64 written once", w)
	}
	if w := sa.Writes + sb.Writes + sa.WritesSkipped + sb.WritesSkipped; w != 128 {
		t.Fatalf("%d parts written or skipped, want 128", w)
	}
	for _, f := range []*fixture{a, b} {
		for _, p := range []string{kv, "draft"} {
			for i, err := range f.get(p, idx...) {
				if err != nil {
					t.Fatalf("get %s %d: %v", p, i, err)
				}
			}
		}
	}
}

func TestStaleTempFilesRemovedAtStart(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "ab")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-staleTempAge - time.Minute)
	files := map[string]bool{ // path: should survive
		filepath.Join(sub, tempPrefix+"x_0_k-1-00"):    false,
		filepath.Join(dir, tempPrefix+"probe-1-00"):    false,
		filepath.Join(sub, tempPrefix+"fresh_0_k-1-0"): true,
	}
	for path, fresh := range files {
		if err := os.WriteFile(path, []byte("partial"), 0o644); err != nil {
			t.Fatal(err)
		}
		if !fresh {
			if err := os.Chtimes(path, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	logs := &logBuffer{}
	s := newStore(t, testConfig(dir, logs))
	for path, keep := range files {
		if exists(path) != keep {
			t.Errorf("%s: exists %v, want %v", path, !keep, keep)
		}
	}
	if st := s.Stats(); st.StaleTempsRemoved != 2 || st.Files != 0 {
		t.Fatalf("stats: %d stale temporary files removed, %d files; want 2, 0", st.StaleTempsRemoved, st.Files)
	}
	if !containsAll(logs.String(), "crashed writers", "files=2") {
		t.Fatalf("log: %s", logs)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// Close waits for the calls in flight, and a closed store refuses new ones.
func TestCloseWaitsForCallsInFlight(t *testing.T) {
	s := newStore(t, testConfig(t.TempDir(), nil))
	g := storagetest.NewGroup(t, s, kvlayout.PageFirst, storagetest.PageSize, mhaPools)
	storagetest.Register(t, s, g)
	keys := storagetest.Keys(t, 1, 64)
	done := make(chan []error)
	go func() { done <- s.Put(bg, kv, keys, pages(make([]int, 64))) }()
	time.Sleep(time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for i, err := range <-done {
		if err != nil && !errors.Is(err, storage.ErrClosed) {
			t.Fatalf("put racing Close, key %d: %v", i, err)
		}
	}
}
