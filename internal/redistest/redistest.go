// Package redistest runs real redis-server processes for tests, through
// internal/redisproc: standalone servers and small Redis Clusters on 127.0.0.1 and
// random free ports, each in a directory of its own under t.TempDir(), stopped by
// process group when the test ends. The log of every server a failed test started
// is printed at the end of the test.
package redistest

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
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
//
// Like t.Skip and t.Fatal, Start may end the calling goroutine (redis-server not
// installed, or not starting): call it from the test's goroutine, and hold no
// lock across it (or release it with defer), or the test deadlocks.
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
// t ends. It may end the calling goroutine, as Start does.
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

// childEnv marks the child process of WithoutRedis, in which WithoutRedis skips:
// the check does not run itself again.
const childEnv = "STRATA_REDISTEST_WITHOUT_REDIS"

// WithoutRedis checks that the tests of the running test binary that match the
// regular expression run ("" for all) skip cleanly where Redis is not installed:
// it runs them, all but t's own test, in a child process of the same binary whose
// PATH is an empty directory (no redis-server, no redis-cli) and whose CI is
// unset, and fails t unless the child passes, with no test failed, within
// timeout (a bound against a hang; make it generous). It returns the child's
// verbose output (go test -v), for checks of which tests skipped. In the child
// itself it skips t.
func WithoutRedis(t *testing.T, run string, timeout time.Duration) string {
	t.Helper()
	if os.Getenv(childEnv) != "" {
		t.Skip("already running without Redis")
	}
	top, _, _ := strings.Cut(t.Name(), "/")
	args := []string{
		"-test.run=" + run, "-test.skip=^" + regexp.QuoteMeta(top) + "$",
		"-test.v", "-test.count=1", "-test.timeout=" + timeout.String(),
	}
	// The child's own -test.timeout ends a hang with every goroutine's stack;
	// the context is the backstop should the child not even get that far.
	ctx, cancel := context.WithTimeout(t.Context(), timeout+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.WaitDelay = 10 * time.Second
	var env []string
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); name != "PATH" && name != "CI" {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "PATH="+t.TempDir(), childEnv+"=1")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	text := string(out)
	if err != nil || strings.Contains(text, "--- FAIL") || !strings.Contains(text, "\nPASS\n") {
		t.Fatalf("tests %q without redis-server on PATH: %v after %v; they must skip, not fail or hang:\n%s",
			run, err, time.Since(start).Round(time.Millisecond), text)
	}
	return text
}
