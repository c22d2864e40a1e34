package spill

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"testing"

	"go.uber.org/goleak"

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

func open(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
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
