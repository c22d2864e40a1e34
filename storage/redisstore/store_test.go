package redisstore

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratakv/strata/internal/redistest"
	"github.com/stratakv/strata/storage"
	"github.com/stratakv/strata/storage/storagetest"
)

// TestConformanceStandalone runs the suite against standalone servers: one fresh
// server per shared name (a server starts in tens of milliseconds), so every
// store the suite asks for is empty at first and shared within its subtest.
func TestConformanceStandalone(t *testing.T) {
	redistest.Require(t)
	var mu sync.Mutex
	servers := map[string]*redistest.Server{}
	server := func(t *testing.T, shared string) *redistest.Server {
		// Deferred, so that the lock is released when Start ends the goroutine.
		mu.Lock()
		defer mu.Unlock()
		srv := servers[shared]
		if srv == nil {
			srv = redistest.Start(t)
			servers[shared] = srv
		}
		return srv
	}
	storagetest.Run(t, func(t *testing.T, shared string) storage.Backend {
		s := newStore(t, testConfig(t, server(t, shared).Addr()))
		if s.Mode() != ModeStandalone {
			t.Fatalf("mode %q, want %q", s.Mode(), ModeStandalone)
		}
		return s
	})
}

// TestConformanceCluster runs the suite against one 3-master cluster, flushed
// (FLUSHALL on every master) when the suite first asks for a shared name. Forming
// a cluster takes seconds, so one serves every subtest; flushing is safe because
// the suite runs its subtests one at a time, closes a subtest's backends before
// the next begins, and never reuses a shared name in another subtest.
func TestConformanceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("forms a Redis Cluster")
	}
	c := redistest.StartCluster(t, 3)
	var mu sync.Mutex
	seen := map[string]bool{}
	flushOnce := func(t *testing.T, shared string) {
		// Deferred, so that the lock is released when a failed FLUSHALL ends the
		// goroutine.
		mu.Lock()
		defer mu.Unlock()
		if !seen[shared] {
			seen[shared] = true
			for _, n := range c.Nodes() {
				do(t, n, "FLUSHALL")
			}
		}
	}
	storagetest.Run(t, func(t *testing.T, shared string) storage.Backend {
		flushOnce(t, shared)
		s := newStore(t, testConfig(t, c.Addrs()...))
		if s.Mode() != ModeCluster {
			t.Fatalf("mode %q, want %q", s.Mode(), ModeCluster)
		}
		return s
	})
}

func TestNewErrors(t *testing.T) {
	srv := redistest.Start(t)
	addr := srv.Addr()
	for _, c := range []struct {
		what string
		cfg  Config
		want error
	}{
		{"no address", DefaultConfig(), storage.ErrConfig},
		{"bad mode", Config{Addrs: []string{addr}, Mode: "sharded"}, storage.ErrConfig},
		{"two standalone addresses", Config{Addrs: []string{addr, addr}, Mode: ModeStandalone}, storage.ErrConfig},
		{"two addresses of a standalone server", DefaultConfig(addr, addr), storage.ErrConfig},
		{"tiny chunks", Config{Addrs: []string{addr}, ChunkBytes: 10}, storage.ErrConfig},
		{"negative backoff", Config{Addrs: []string{addr}, Backoff: -1}, storage.ErrConfig},
	} {
		if _, err := New(bg, c.cfg); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.what, err, c.want)
		}
	}
	cluster := testConfig(t, addr)
	cluster.Mode = ModeCluster
	if _, err := New(bg, cluster); !errors.Is(err, storage.ErrUnavailable) {
		t.Errorf("cluster mode on a standalone server: %v, want ErrUnavailable", err)
	}
	// A server that is not there.
	srv.Kill()
	for _, mode := range []string{ModeAuto, ModeStandalone, ModeCluster} {
		cfg := testConfig(t, addr)
		cfg.Mode = mode
		if _, err := New(bg, cfg); !errors.Is(err, storage.ErrUnavailable) {
			t.Errorf("mode %s, server down: %v, want ErrUnavailable", mode, err)
		}
	}
	// A server that wants a password.
	locked := redistest.Start(t, "--requirepass", "sesame")
	if _, err := New(bg, testConfig(t, locked.Addr())); !errors.Is(err, storage.ErrConfig) {
		t.Errorf("no password: %v, want ErrConfig", err)
	}
	cfg := testConfig(t, locked.Addr())
	cfg.Password = "sesame"
	s := newStore(t, cfg)
	if err := s.PutObject(bg, "o", 1, []byte("hello")); err != nil {
		t.Fatal(err)
	}
}

// TestWithoutRedis runs this package's tests where redis-server is not
// installed: those that need it skip with the reason, none fails or hangs (the
// conformance suite once deadlocked, skipping while it held a lock).
func TestWithoutRedis(t *testing.T) {
	out := redistest.WithoutRedis(t, "", 2*time.Minute)
	for _, name := range []string{"TestConformanceStandalone", "TestConformanceCluster", "TestDeadMaster", "TestServerDownAndHung", "TestObjectAPI"} {
		if !strings.Contains(out, "--- SKIP: "+name+" ") {
			t.Errorf("%s did not skip without redis-server", name)
		}
	}
	if !strings.Contains(out, "--- PASS: TestCutPlan ") {
		t.Errorf("TestCutPlan, which needs no Redis, did not run")
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}
