package spill

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/internal/vecio"
	"github.com/stratakv/strata/storage"
)

// TestMain checks that no test leaves the writer goroutine running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var bg = context.Background()

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testConfig is a spill in dir with small buffers and segments, so that tests
// cross buffer and segment boundaries with little data.
func testConfig(dir string) Config {
	c := DefaultConfig(dir)
	c.CapacityBytes = 64 << 20
	c.SegmentBytes = 1 << 20
	c.BufferBytes = 64 << 10
	c.Logger = quiet
	return c
}

// privateTempDir is a new directory as New wants it: this user's, mode 0700
// (t.TempDir's are 0755, which New makes 0700 while they are empty).
func privateTempDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

func open(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeWithin(t, s, time.Minute) })
	return s
}

// closeWithin closes s, failing t by name if Close does not return within d
// (a call that kept the spill's mutex, or a buffer, after a panic), with the
// goroutines' stacks, instead of hanging until the test binary's timeout.
func closeWithin(t testing.TB, s *Store, d time.Duration) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Close()
	}()
	select {
	case <-done:
	case <-time.After(d):
		buf := make([]byte, 1<<20)
		t.Errorf("%s: the spill's Close did not return within %v; goroutines:\n%s", t.Name(), d, buf[:runtime.Stack(buf, true)])
	}
}

// within runs fn and fails t by name if it does not return within d.
func within(t testing.TB, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(d):
		buf := make([]byte, 1<<20)
		t.Fatalf("%s did not return within %v; goroutines:\n%s", what, d, buf[:runtime.Stack(buf, true)])
	}
}

// skipOutsideCI skips t with why, outside CI; in CI (CI=true) the test must
// run, and fails instead.
func skipOutsideCI(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (CI runs this test: fix the environment)", why)
	}
	t.Skip(why)
}

// crash abandons s as a killed process would leave it: what is staged and
// not yet written stays unwritten, the segments being written get no hint
// file, and the directory is released. Nothing may be in flight.
func (s *Store) crash() {
	if !s.markClosed() {
		return
	}
	s.inflight.Wait()
	s.stopScan()
	s.stopCompaction()
	s.halt()
	s.writer.Wait()
	s.closeSegments()
	s.closeIndex()
	if s.mapped != nil {
		_ = unix.Munmap(s.mapped)
		s.mapped = nil
	}
	_ = unix.Close(s.lock)
	_ = unix.Close(s.dirfd)
}

// halt stops the writer and any compaction where they are, as a crash
// would: the writer writes nothing more. It may be called from a test hook
// (without s.mu); crash then releases the rest.
func (s *Store) halt() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.compactCancel()
	s.abandon = true
	s.stopping = true
	s.cond.Broadcast()
}

// compactAll compacts, in the caller's goroutine, every segment under below
// until none is left (the spill's own compactor off: CompactBelow 0).
func (s *Store) compactAll(below float64) {
	for s.compactNext(below) {
	}
}

// data is n bytes that depend on seed.
func data(n int, seed int) []byte {
	b := make([]byte, n)
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

func put(t testing.TB, s *Store, key string, b []byte) {
	t.Helper()
	if err := s.PutObject(bg, key, 7, b); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

// get reads key's object of n bytes (format 7).
func get(s *Store, key string, n int) ([]byte, error) {
	b := make([]byte, n)
	err := s.GetObject(bg, key, 7, b)
	return b, err
}

func mustGet(t testing.TB, s *Store, key string, want []byte) {
	t.Helper()
	b, err := get(s, key, len(want))
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if string(b) != string(want) {
		t.Fatalf("get %s: wrong bytes", key)
	}
}

func mustMiss(t testing.TB, s *Store, key string, n int) {
	t.Helper()
	if _, err := get(s, key, n); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("get %s: %v, want not found", key, err)
	}
}

// flush writes what the buffers hold and waits until it is written.
func (s *Store) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sealLocked()
	for len(s.queue) > 0 || s.unwritten > 0 {
		s.cond.Wait()
	}
}

// alignedBytes is n bytes at a block-aligned address, as the arena's objects are.
func alignedBytes(n int64) []byte { return vecio.AlignedBytes(int(n), block) }

// setHook sets the spill's test hook (nil: none).
func (s *Store) setHook(fn func(point, key string)) {
	if fn == nil {
		s.hook.Store(nil)
		return
	}
	s.hook.Store(&fn)
}

// holdAt returns a hook that holds the first call at point for key until
// release is closed, closing reached when it gets there.
func holdAt(point, key string) (hook func(string, string), reached, release chan struct{}) {
	reached, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	return func(p, k string) {
		if p == point && k == key {
			once.Do(func() {
				close(reached)
				<-release
			})
		}
	}, reached, release
}

// wait receives from ch, failing t by name after a minute.
func wait[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		buf := make([]byte, 1<<20)
		t.Fatalf("%s: nothing within a minute; goroutines:\n%s", what, buf[:runtime.Stack(buf, true)])
		panic("unreachable")
	}
}
