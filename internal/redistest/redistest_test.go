package redistest

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// gone reports whether process pid no longer exists (reaped). pid must be a
// process id: kill(0, 0) signals the caller's own process group and succeeds.
func gone(pid int) bool { return pid > 0 && errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }

func TestStandalone(t *testing.T) {
	Require(t)
	var pid int
	t.Run("server", func(t *testing.T) {
		s := Start(t, "--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru")
		pid = s.PID()
		if _, err := s.Do("SET", "k", "v"); err != nil {
			t.Fatal(err)
		}
		if v, err := s.Do("GET", "k"); err != nil || v != "v" {
			t.Fatalf("GET k = %q, %v", v, err)
		}
		if _, err := s.Do("GET", "missing"); !errors.Is(err, ErrNil) {
			t.Fatalf("GET missing: %v, want ErrNil", err)
		}
		if v, err := s.Do("CONFIG", "GET", "maxmemory-policy"); err != nil || v != "maxmemory-policy\nallkeys-lru" {
			t.Fatalf("extra args not applied: %q, %v", v, err)
		}
		if _, err := s.Do("NOSUCHCOMMAND"); err == nil {
			t.Fatal("error reply not reported")
		}
		s.Kill()
		if s.Running() || !gone(pid) {
			t.Fatal("Kill left the process")
		}
		if _, err := s.Do("PING"); err == nil {
			t.Fatal("killed server answers")
		}
		s.Restart(t)
		if s.PID() == pid {
			t.Fatal("Restart kept the pid")
		}
		if v, err := s.Do("PING"); err != nil || v != "PONG" {
			t.Fatalf("PING after restart = %q, %v", v, err)
		}
		pid = s.PID()
	})
	// pid is 0 when the subtest failed before its server started: that failure
	// is reported already.
	if pid != 0 && !gone(pid) {
		t.Fatalf("redis-server pid %d still runs after its test ended", pid)
	}
}

func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	Require(t)
	var pids []int
	t.Run("cluster", func(t *testing.T) {
		c := StartCluster(t, 3)
		if len(c.Addrs()) != 3 || len(c.Nodes()) != 3 {
			t.Fatalf("%d addrs, %d nodes", len(c.Addrs()), len(c.Nodes()))
		}
		for _, s := range c.Nodes() {
			pids = append(pids, s.PID())
			if _, err := os.Stat(s.Dir() + "/nodes.conf"); err != nil {
				t.Fatalf("node %s: %v", s.Addr(), err)
			}
		}
		// Every key is served by exactly one master: the others redirect.
		for i := range 20 {
			key := fmt.Sprintf("key-%d", i)
			served := 0
			for _, s := range c.Nodes() {
				_, err := s.Do("SET", key, "v")
				switch {
				case err == nil:
					served++
				case !strings.Contains(err.Error(), "MOVED"):
					t.Fatalf("SET %s on %s: %v", key, s.Addr(), err)
				}
			}
			if served != 1 {
				t.Fatalf("key %s served by %d masters", key, served)
			}
		}
		victim := c.Nodes()[1]
		victim.Kill()
		victim.Restart(t)
		c.WaitOK(t, 30*time.Second)
		pids = append(pids, victim.PID())
	})
	for _, pid := range pids {
		if !gone(pid) {
			t.Fatalf("redis-server pid %d still runs after its test ended", pid)
		}
	}
}

func TestClusterByHand(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	c := StartCluster(t, 2)
	if v, err := c.Nodes()[0].Do("CLUSTER", "INFO"); err != nil || !strings.Contains(v, "cluster_size:2") {
		t.Fatalf("CLUSTER INFO = %q, %v", v, err)
	}
}

// recorder is a testing.TB that records Skip and Fatal instead of ending the test.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Skip(args ...any)                  { r.skipped = fmt.Sprint(args...) }
func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestRequire(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv("CI", "")
	r := &recorder{TB: t}
	Require(r)
	if !strings.Contains(r.skipped, "redis-server not installed: apt-get install redis-server") || r.failed != "" {
		t.Fatalf("outside CI: skipped %q, failed %q", r.skipped, r.failed)
	}
	t.Setenv("CI", "true")
	r = &recorder{TB: t}
	Require(r)
	if r.failed == "" || r.skipped != "" {
		t.Fatalf("in CI: skipped %q, failed %q", r.skipped, r.failed)
	}
}

// TestWithoutRedis runs this package's tests where redis-server is not
// installed: each test that needs it skips with the reason, none fails or hangs.
func TestWithoutRedis(t *testing.T) {
	out := WithoutRedis(t, "", 2*time.Minute)
	for _, name := range []string{"TestStandalone", "TestCluster", "TestClusterByHand"} {
		if !strings.Contains(out, "--- SKIP: "+name+" ") {
			t.Errorf("%s did not skip without redis-server", name)
		}
	}
	if !strings.Contains(out, "redis-server not installed") {
		t.Errorf("no skip says why")
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}
