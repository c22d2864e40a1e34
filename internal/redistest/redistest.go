// Package redistest runs real redis-server processes for tests, through
// internal/redisproc: standalone servers and small Redis Clusters on 127.0.0.1 and
// random free ports, each in a directory of its own under t.TempDir(), stopped by
// process group when the test ends. The log of every server a failed test started
// is printed at the end of the test.
package redistest

import (
	"os"
	"testing"
	"time"

	"github.com/stratakv/strata/internal/redisproc"
)

// Require skips t when redis-server or redis-cli is not installed, with a one-line
// reason, except where the environment variable CI is "true": there the tests that
// need Redis are mandatory, and t fails instead.
func Require(t testing.TB) {
	t.Helper()
	if err := redisproc.Installed(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v (CI=true: tests that need Redis must run)", err)
			return
		}
		t.Skip(err.Error())
	}
}

// ReplyError is an error reply of a server, such as "ERR unknown command".
type ReplyError = redisproc.ReplyError

// ErrNil is Server.Do's error for a nil reply (a missing key).
var ErrNil = redisproc.ErrNil

// Server is a redis-server process that the test owns; see redisproc.Server for
// Addr, Do, Kill, PID, Dir, Running and LogTail.
type Server struct {
	*redisproc.Server
}

// Start starts a standalone redis-server with persistence off and waits until it
// answers PING. args are extra configuration directives in redis-server's
// command-line form, such as "--maxmemory", "8mb"; they override the defaults.
// The server is stopped when t ends.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	Require(t)
	s, err := redisproc.Start(t.TempDir(), args...)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	own(t, s)
	return &Server{s}
}

// own stops s when t ends and prints its log when t failed.
func own(t testing.TB, s *redisproc.Server) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("redis-server %s (pid %d) log, last lines:\n%s", s.Addr(), s.PID(), s.LogTail(40))
		}
	})
	t.Cleanup(s.Stop)
}

// Restart starts the server again with the same port, directory and
// configuration (killing it first if it runs) and fails t when it cannot.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.Server.Restart(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

// Cluster is a Redis Cluster of masters without replicas that the test owns; see
// redisproc.Cluster.
type Cluster struct {
	c     *redisproc.Cluster
	nodes []*Server
}

// StartCluster starts a cluster of masters masters that covers every slot and
// waits until it is healthy. It takes a few seconds; its servers are stopped when
// t ends.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	Require(t)
	c, err := redisproc.StartCluster(t.TempDir(), masters)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	out := &Cluster{c: c}
	for _, s := range c.Nodes() {
		own(t, s)
		out.nodes = append(out.nodes, &Server{s})
	}
	return out
}

// Addrs are the nodes' addresses, in the order of Nodes.
func (c *Cluster) Addrs() []string { return c.c.Addrs() }

// Nodes are the cluster's servers, to Kill and Restart.
func (c *Cluster) Nodes() []*Server { return append([]*Server(nil), c.nodes...) }

// WaitOK waits until the cluster is healthy again (every node ok, every slot
// served) and fails t when that takes longer than timeout.
func (c *Cluster) WaitOK(t testing.TB, timeout time.Duration) {
	t.Helper()
	if err := c.c.WaitOK(timeout); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}
