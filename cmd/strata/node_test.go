package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// strataProcess starts the test binary as `strata args...` in its own process.
func strataProcess(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "STRATA_TEST_AS_MAIN=1")
	if testing.Verbose() {
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// waitStats polls the service until ok accepts its stats.
func waitStats(t *testing.T, socket string, what string, ok func(st statsView) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, _, err := fetchStats(ctx, socket)
		cancel()
		segments := 0
		for _, c := range st.Clients {
			segments += len(c.Segments)
		}
		if err == nil && ok(statsView{clients: len(st.Clients), puts: st.Ops.PutObjects, segments: segments}) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for the node service: %s (last error %v)", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type statsView struct {
	clients, segments int
	puts              int64
}

func startServe(t *testing.T, socket, spill string) *exec.Cmd {
	cmd := strataProcess(t, "serve", "--socket", socket, "--arena", "256MiB", "--admin", "", "--spill-dir", spill, "--log-level", "error")
	waitStats(t, socket, "listening", func(statsView) bool { return true })
	return cmd
}

// The node service is killed with SIGKILL and restarted while a bench runs on it:
// the bench finishes with no corrupt page, and its client registers again with
// the new service by itself. The bench runs as its own process and is stopped
// (SIGSTOP) while the service is killed and restarted, so that however slowly a
// busy machine restarts the service, the bench still has most of its requests
// left when the service is back.
func TestBenchSurvivesNodeServiceKill9(t *testing.T) {
	dir := shortDir(t)
	socket := filepath.Join(dir, "s")
	server := startServe(t, socket, filepath.Join(dir, "spill"))
	jsonPath := filepath.Join(dir, "r.json")
	bench := strataProcess(t, "bench", "--runs", "strata", "--l3", "node", "--socket", socket,
		"--clients", "32", "--rounds", "5", "--request-tokens", "256", "--output-tokens", "16",
		"--l1-tokens", "2048", "--l2-ratio", "1", "--max-running", "4", "--json", jsonPath)
	done := make(chan error, 1)
	go func() { done <- bench.Wait() }()
	waitStats(t, socket, "the bench putting pages", func(st statsView) bool { return st.puts > 0 })
	if err := bench.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := server.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = server.Wait()
	if err := bench.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the bench runs on without L3 for a moment
	if err := bench.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	startServe(t, socket, filepath.Join(dir, "spill"))
	if err := bench.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// Poll from this goroutine until the bench's client has registered its pools
	// again, or the bench is over.
	reRegistered, finished := false, false
	var benchErr error
	deadline := time.Now().Add(5 * time.Minute)
	for !finished && time.Now().Before(deadline) {
		select {
		case benchErr = <-done:
			finished = true
		case <-time.After(20 * time.Millisecond):
		}
		if !reRegistered {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, _, err := fetchStats(ctx, socket)
			cancel()
			segments := 0
			for _, c := range st.Clients {
				segments += len(c.Segments)
			}
			reRegistered = err == nil && segments >= 2
		}
	}
	if !finished {
		t.Fatal("bench did not finish in 5 minutes after the node service restarted")
	}
	if benchErr != nil {
		t.Fatalf("bench after the node service restarted: %v", benchErr)
	}
	if !reRegistered {
		t.Fatal("the bench finished without its client registering its pools with the restarted service")
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Runs []struct {
			Name          string `json:"name"`
			CorruptPages  int64  `json:"corrupt_pages"`
			VerifiedPages int64  `json:"verified_pages"`
			L3            struct {
				Faults map[string]int64 `json:"faults"`
			} `json:"l3"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	r := rep.Runs[0]
	if r.CorruptPages != 0 || r.VerifiedPages == 0 {
		t.Fatalf("after a kill -9: %+v", r)
	}
	if r.L3.Faults["unavailable"] == 0 {
		t.Logf("no unavailable faults counted (the kill fell between calls): %v", r.L3.Faults)
	}
}

// Several engine processes share one node service: pages one computes are L3 hits
// for the others.
func TestBenchEnginesShareTheNodeService(t *testing.T) {
	dir := shortDir(t)
	jsonPath := filepath.Join(dir, "r.json")
	t.Setenv("STRATA_TEST_AS_MAIN", "1") // the engines are this binary
	code, out, errs := runCLI(t, "", "bench", "--runs", "strata", "--engines", "2", "--node-arena", "128MiB",
		"--clients", "8", "--rounds", "4", "--request-tokens", "256", "--output-tokens", "16",
		"--l1-tokens", "2048", "--l2-ratio", "1", "--max-running", "4", "--json", jsonPath)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "2 engine processes") {
		t.Fatalf("table:\n%s", out)
	}
	// Progress counts requests across the engines, not engines (once "100% (2/2)").
	m := regexp.MustCompile(`strata \(2 engines\): 100% \((\d+)/(\d+)\)`).FindStringSubmatch(errs)
	if m == nil || m[1] != m[2] || m[1] == "2" {
		t.Errorf("progress does not count requests across engines:\n%s", errs)
	}
	raw, _ := os.ReadFile(jsonPath)
	var rep struct {
		Runs []struct {
			Engines      int   `json:"engines"`
			Cross        int64 `json:"cross_engine_hit_tokens"`
			CorruptPages int64 `json:"corrupt_pages"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if r := rep.Runs[0]; r.Engines != 2 || r.Cross == 0 || r.CorruptPages != 0 {
		t.Fatalf("multi-engine run %+v", r)
	}
}
