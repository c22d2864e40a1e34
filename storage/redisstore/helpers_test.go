package redisstore

import (
	"bytes"
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stratakv/strata/internal/redistest"
)

var bg = context.Background()

// testConfig is DefaultConfig for addrs with a short backoff, a long call
// timeout and a logger that writes to the test's log. The call timeout is long
// because a busy machine running -race can stall a call for seconds, and a
// test that expects no fault must not see one for that; tests of timeouts set
// their own.
func testConfig(t testing.TB, addrs ...string) Config {
	cfg := DefaultConfig(addrs...)
	cfg.CallTimeout = 20 * time.Second
	cfg.Backoff = 100 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	return cfg
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(bytes.TrimRight(b, "\n")))
	return len(b), nil
}

// testClock is a clock for shard backoffs (Config.now) that stands still until
// the test advances it: a shard that failed stays skipped however slowly a busy
// machine runs the test, and is tried again once the test moves the clock past
// its backoff.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock() *testClock { return &testClock{now: time.Now()} }

// Now is the clock's time.
func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// newStore opens a store and closes it when t ends.
func newStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := New(bg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// randBytes returns n bytes drawn from seed.
func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n - n%8; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

// split cuts b into runs at the given offsets.
func split(b []byte, at ...int) [][]byte {
	var out [][]byte
	prev := 0
	for _, a := range at {
		out = append(out, b[prev:a])
		prev = a
	}
	return append(out, b[prev:])
}

// do runs a command on srv and fails t on error.
func do(t testing.TB, srv *redistest.Server, args ...string) string {
	t.Helper()
	v, err := srv.Do(args...)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return v
}

// keyCount is the number of keys on srv.
func keyCount(t testing.TB, srv *redistest.Server) string {
	t.Helper()
	return do(t, srv, "DBSIZE")
}
