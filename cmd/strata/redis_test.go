package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratakv/strata/internal/redistest"
)

// benchRun is the part of a bench report the Redis tests read.
type benchRun struct {
	Name          string           `json:"name"`
	HitTokens     map[string]int64 `json:"hit_tokens"`
	VerifiedPages int64            `json:"verified_pages"`
	CorruptPages  int64            `json:"corrupt_pages"`
	Engines       int              `json:"engines"`
	Nodes         int              `json:"nodes"`
	CrossNode     int64            `json:"cross_node_hit_tokens"`
	CrossEngine   int64            `json:"cross_engine_hit_tokens"`
	Remote        *struct {
		Written int64 `json:"written"`
		Hits    int64 `json:"hits"`
	} `json:"remote"`
	L3 struct {
		Faults map[string]int64 `json:"faults"`
	} `json:"l3"`
}

func readBenchRun(t *testing.T, path string) benchRun {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Runs []benchRun `json:"runs"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil || len(rep.Runs) != 1 {
		t.Fatalf("report %s: %v, %d runs", path, err, len(rep.Runs))
	}
	return rep.Runs[0]
}

// watchWriter collects what is written to it and closes seen once want appears.
type watchWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *watchWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func dbsize(t *testing.T, s *redistest.Server) int {
	t.Helper()
	v, err := s.Do("DBSIZE")
	if err != nil {
		return -1
	}
	n, _ := strconv.Atoi(v)
	return n
}

// One master of a three-master cluster is killed with SIGKILL while `strata
// bench --l3 redis` runs on the cluster: the bench completes with no corrupt
// page (the dead master's keys are misses), and once the master is restarted
// its slots take pages again.
func TestBenchRedisSurvivesMasterKill9(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	addrs := strings.Join(c.Addrs(), ",")
	victim := c.Nodes()[1]
	dir := shortDir(t)
	bench := func(jsonPath string, clients string, stderr io.Writer) int {
		return run(context.Background(), []string{"bench", "--runs", "strata", "--l3", "redis", "--redis", addrs,
			"--clients", clients, "--rounds", "6", "--request-tokens", "256", "--output-tokens", "16",
			"--l1-tokens", "2048", "--l2-ratio", "1", "--max-running", "4", "--json", jsonPath},
			strings.NewReader(""), io.Discard, stderr)
	}
	type result struct {
		code int
		errs string
	}
	done := make(chan result, 1)
	first := filepath.Join(dir, "1.json")
	// The kill comes when the bench reports 40% of its requests served: by then
	// pages are in the cluster and L3 hits have been served.
	progress := &watchWriter{want: "strata: 40%", seen: make(chan struct{})}
	go func() {
		code := bench(first, "24", progress)
		done <- result{code, progress.String()}
	}()
	select {
	case <-progress.seen:
	case res := <-done:
		t.Fatalf("bench ended before 40%% (exit %d): %s", res.code, res.errs)
	case <-time.After(2 * time.Minute):
		t.Fatal("the bench did not reach 40%")
	}
	victim.Kill()
	var res result
	select {
	case res = <-done:
	case <-time.After(5 * time.Minute):
		t.Fatal("bench did not finish after a master was killed")
	}
	if res.code != 0 {
		t.Fatalf("bench exit %d: %s", res.code, res.errs)
	}
	r := readBenchRun(t, first)
	if r.CorruptPages != 0 || r.VerifiedPages == 0 || r.HitTokens["l3"] == 0 {
		t.Fatalf("after a master's kill -9: %+v", r)
	}
	t.Logf("with a master killed at 40%%: L3 hit tokens %d, verified pages %d, faults %v", r.HitTokens["l3"], r.VerifiedPages, r.L3.Faults)
	if r.L3.Faults["unavailable"]+r.L3.Faults["timeout"] == 0 {
		t.Fatalf("the bench ended before the kill reached it (no unavailable or timeout faults): %+v", r.L3.Faults)
	}

	victim.Restart(t)
	c.WaitOK(t, 30*time.Second)
	if n := dbsize(t, victim); n != 0 {
		t.Fatalf("restarted master (no persistence) holds %d keys", n)
	}
	second := filepath.Join(dir, "2.json")
	var errs bytes.Buffer
	if code := bench(second, "8", &errs); code != 0 {
		t.Fatalf("bench after the restart: exit %d: %s", code, errs.String())
	}
	r = readBenchRun(t, second)
	if r.CorruptPages != 0 || len(r.L3.Faults) != 0 {
		t.Fatalf("after the restart: %+v", r)
	}
	if n := dbsize(t, victim); n < 1 {
		t.Fatal("the restarted master's slots took no pages")
	}
}

// --nodes 2: two node services writing through to one Redis Cluster, an engine on
// each; pages prefilled through one node are hits through the other.
func TestBenchTwoNodesShareRedis(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	jsonPath := filepath.Join(shortDir(t), "r.json")
	t.Setenv("STRATA_TEST_AS_MAIN", "1") // the engines are this binary
	code, out, errs := runCLI(t, "", "bench", "--runs", "strata", "--nodes", "2", "--redis", strings.Join(c.Addrs(), ","),
		"--node-arena", "64MiB", "--clients", "8", "--rounds", "4", "--request-tokens", "256", "--output-tokens", "16",
		"--l1-tokens", "2048", "--l2-ratio", "1", "--max-running", "4", "--json", jsonPath)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "cross-node hits") || !strings.Contains(out, "writing through to Redis") {
		t.Fatalf("table:\n%s", out)
	}
	r := readBenchRun(t, jsonPath)
	if r.Nodes != 2 || r.Engines != 2 || r.CrossNode == 0 || r.CorruptPages != 0 {
		t.Fatalf("two-node run %+v", r)
	}
	if r.CrossNode > r.HitTokens["l3"] || r.Remote == nil || r.Remote.Written == 0 || r.Remote.Hits == 0 {
		t.Fatalf("cross-node %d of %d L3 hit tokens, remote %+v", r.CrossNode, r.HitTokens["l3"], r.Remote)
	}

	// Engines straight on Redis, no node service: the same sharing.
	code, out, errs = runCLI(t, "", "bench", "--runs", "strata", "--l3", "redis", "--engines", "2", "--redis", strings.Join(c.Addrs(), ","),
		"--clients", "8", "--rounds", "4", "--request-tokens", "256", "--output-tokens", "16",
		"--l1-tokens", "2048", "--l2-ratio", "1", "--max-running", "4", "--json", jsonPath)
	if code != 0 {
		t.Fatalf("--l3 redis --engines 2: exit %d: %s", code, errs)
	}
	if r := readBenchRun(t, jsonPath); r.Engines != 2 || r.CrossEngine == 0 || r.CorruptPages != 0 || !strings.Contains(out, "2 engine processes sharing L3") {
		t.Fatalf("engines on Redis: %+v\n%s", r, out)
	}
}

func TestBenchRedisBadFlagsExitTwo(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--l3", "redis", "--redis", "no-port"},
		{"bench", "--nodes", "2", "--l3", "file"},
		{"bench", "--nodes", "2", "--socket", "/tmp/x.sock"},
		{"bench", "--nodes", "3", "--engines", "2"},
		{"bench", "--engines", "2", "--l3", "file"},
	} {
		code, _, errs := runCLI(t, "", args...)
		if code != 2 || strings.Count(errs, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q", args, code, errs)
		}
	}
	// Without Redis installed and none given, the bench says what to do.
	t.Setenv("PATH", t.TempDir())
	code, _, errs := runCLI(t, "", "bench", "--runs", "strata", "--l3", "redis", "--clients", "2", "--rounds", "1")
	if code != 2 || !strings.Contains(errs, "--redis") || !strings.Contains(errs, "apt-get install redis-server") {
		t.Fatalf("no Redis: exit %d, stderr %q", code, errs)
	}
}

// `strata serve --remote` writes through to Redis, and `strata inspect` shows the
// remote tier; a remote queue of 0 is refused as a usage error.
func TestServeRemoteAndInspect(t *testing.T) {
	srv := redistest.Start(t)
	dir := shortDir(t)
	socket := filepath.Join(dir, "s")
	strataProcess(t, "serve", "--socket", socket, "--arena", "64MiB", "--admin", "", "--remote", srv.Addr(),
		"--remote-queue", "16MiB", "--log-level", "error")
	waitStats(t, socket, "listening", func(statsView) bool { return true })
	want := "remote  Redis " + srv.Addr() + ": connected true"
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, out, errs := runCLI(t, "", "inspect", "--socket", socket)
		if code != 0 {
			t.Fatalf("inspect: exit %d: %s", code, errs)
		}
		if strings.Contains(out, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("inspect never showed %q:\n%s", want, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	code, _, errs := runCLI(t, "", "serve", "--socket", filepath.Join(dir, "t"), "--admin", "", "--remote", srv.Addr(), "--remote-queue", "0")
	if code != 2 || !strings.Contains(errs, "remote queue") {
		t.Fatalf("--remote-queue 0: exit %d, stderr %q", code, errs)
	}
}
