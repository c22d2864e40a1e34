package node

import (
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratakv/strata/internal/redistest"
	"github.com/stratakv/strata/node/wire"
)

// waitRemoteConnected waits until s has reached its Redis.
func waitRemoteConnected(t *testing.T, s *Server) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for st := s.Stats().Remote; st == nil || !st.Connected; st = s.Stats().Remote {
		if time.Now().After(deadline) {
			t.Fatalf("the service did not reach Redis: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Two node services on one Redis stand for two nodes: a page put through one is a
// hit through the other.
func TestTwoNodesShareOneRedis(t *testing.T) {
	redis := redistest.Start(t)
	remote := func(c *Config) { c.RemoteAddrs = []string{redis.Addr()} }
	a, b := start(t, remote), start(t, remote)
	// Writes before a service reached Redis are dropped, by design: wait.
	waitRemoteConnected(t, a)
	waitRemoteConnected(t, b)
	ca, cb := dial(t, a), dial(t, b)
	ra, sa := ca.segment(1 << 20)
	rb, sb := cb.segment(1 << 20)
	for i := range ra.Bytes()[:8192] {
		ra.Bytes()[i] = byte(i*7 + 1)
	}
	if res := ca.batch(wire.TypePut, item("p:0", sa, 0, 4096), item("p:1", sa, 4096, 4096)); res[0].Status != wire.OK || res[1].Status != wire.OK {
		t.Fatalf("put through node A: %+v", res)
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.Stats().Remote.Written < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("node A did not write through: %+v", a.Stats().Remote)
		}
		time.Sleep(10 * time.Millisecond)
	}
	m, err := cb.call(wire.TypeExists, wire.Exists{Keys: []string{"p:0", "p:1", "p:2"}, Format: 7})
	if err != nil || m.(*wire.ExistsReply).Present != 2 {
		t.Fatalf("exists through node B: %+v %v", m, err)
	}
	res := cb.batch(wire.TypeGet, item("p:1", sb, 0, 4096), item("p:0", sb, 4096, 4096), item("p:9", sb, 8192, 4096))
	if res[0].Status != wire.OK || res[1].Status != wire.OK || res[2].Status != wire.NotFound {
		t.Fatalf("get through node B: %+v", res)
	}
	for i := 0; i < 4096; i++ {
		if rb.Bytes()[i] != byte((4096+i)*7+1) || rb.Bytes()[4096+i] != byte(i*7+1) {
			t.Fatalf("node B served wrong bytes at %d", i)
		}
	}
	st := b.Stats()
	if st.Remote.Hits != 2 || st.Ops.Promotions != 2 || st.Arena.Objects != 2 {
		t.Fatalf("node B: remote %+v, promotions %d, arena objects %d", st.Remote, st.Ops.Promotions, st.Arena.Objects)
	}
	// Promoted: the next get is an arena hit.
	cb.batch(wire.TypeGet, item("p:1", sb, 0, 4096))
	if st := b.Stats(); st.Ops.ArenaHits != 1 {
		t.Fatalf("promoted object not served from the arena: %+v", st.Ops)
	}
}

// A Redis that is down at start: the service serves its own tiers and counts the
// remote as unconnected; gets that miss locally are misses, not errors.
func TestRemoteDownServesLocally(t *testing.T) {
	redis := redistest.Start(t)
	addr := redis.Addr()
	redis.Kill()
	s := start(t, func(c *Config) { c.RemoteAddrs = []string{addr} })
	c := dial(t, s)
	_, seg := c.segment(1 << 20)
	if res := c.batch(wire.TypePut, item("x", seg, 0, 4096)); res[0].Status != wire.OK {
		t.Fatalf("put with Redis down: %+v", res)
	}
	res := c.batch(wire.TypeGet, item("x", seg, 8192, 4096), item("y", seg, 0, 16))
	if res[0].Status != wire.OK || res[1].Status != wire.NotFound {
		t.Fatalf("get with Redis down: %+v", res)
	}
	if st := s.Stats(); st.Remote == nil || st.Remote.Connected {
		t.Fatalf("remote stats %+v", st.Remote)
	}
}

// syncBuffer is a log sink for tests, safe for the service's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A Redis that does not answer is one log line when the service finds it gone
// and one when it answers again, with the count of failed attempts between;
// before, every retry logged a warning with the whole error (six in three
// seconds), the joined errors' newlines included.
func TestRedisOutageIsTwoLogLines(t *testing.T) {
	redis := redistest.Start(t)
	redis.Kill() // the address stays known; nothing answers there
	var logs syncBuffer
	s := start(t, func(c *Config) {
		c.RemoteAddrs = []string{redis.Addr()}
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.remote.reach.mu.Lock()
		n := s.remote.reach.failures
		s.remote.reach.mu.Unlock()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the service tried Redis %d times in 20 s", n)
		}
	}
	redis.Restart(t)
	waitRemoteConnected(t, s)
	// Connected flips before the outage's recovery line is written: wait for
	// the line (bounded), then count.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "Redis answers again"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the service reached Redis again but logged no recovery in 10 s:\n%s", logs.String())
		}
	}
	var warns, backs []string
	for _, line := range strings.Split(logs.String(), "\n") {
		switch {
		case strings.Contains(line, "level=WARN") && strings.Contains(line, "Redis"):
			warns = append(warns, line)
		case strings.Contains(line, "Redis answers again"):
			backs = append(backs, line)
		}
	}
	if len(warns) != 1 || len(backs) != 1 {
		t.Fatalf("an outage of 3+ attempts logged %d warnings and %d recoveries, want 1 and 1:\n%s", len(warns), len(backs), logs.String())
	}
	if !strings.Contains(backs[0], "failures=") {
		t.Fatalf("the recovery line does not count the failures: %s", backs[0])
	}
}

// The service does not know how to reach a remote store by itself: remote
// addresses without OpenRemote are a configuration error, said at start.
func TestRemoteAddrsWithoutAnOpenerAreRefused(t *testing.T) {
	cfg := DefaultConfig(socketPath(t))
	cfg.RemoteAddrs, cfg.Logger = []string{"127.0.0.1:1"}, quiet
	if _, err := New(cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "OpenRemote") {
		t.Fatalf("New = %v, want ErrConfig naming OpenRemote", err)
	}
}
