package storagebench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratakv/strata/node"
)

// nodeConfig is a node run of 2 batches of 8 toy pages.
func nodeConfig(t *testing.T) Config {
	t.Helper()
	cfg := tinyConfig(t)
	cfg.Backend = BackendNode
	return cfg
}

// redisInstalled reports whether redis-server is in PATH; without it a test that
// needs it skips, except in CI, where it fails.
func redisInstalled(t *testing.T) bool {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server is not installed, and CI must run the Redis peer: apt-get install redis-server")
		}
		return false
	}
	return true
}

// checkNodeReport checks what every node run reports, timing aside.
func checkNodeReport(t *testing.T, rep *Report, cfg Config) {
	t.Helper()
	positive := map[string]float64{
		"put_gbps": rep.PutGBps, "get_gbps": rep.GetGBps,
		"peer_put_gbps": rep.PeerPutGBps, "peer_get_gbps": rep.PeerGetGBps,
		"put_ratio": rep.PutRatio, "get_ratio": rep.GetRatio,
		"cold_put_gbps": rep.ColdPutGBps, "cold_get_gbps": rep.ColdGetGBps,
		"exists_p50_us": rep.ExistsP50us, "exists_p99_us": rep.ExistsP99us,
	}
	two := rep.Engines
	n := cfg.engines()
	if two == nil || two.Engines != n {
		t.Fatalf("engines phase %+v, want %d engines", two, n)
	}
	for k, v := range map[string]float64{"put_gbps": two.PutGBps, "get_gbps": two.GetGBps, "peer_put_gbps": two.PeerPutGBps,
		"peer_get_gbps": two.PeerGetGBps, "put_ratio": two.PutRatio, "get_ratio": two.GetRatio} {
		positive["engines."+k] = v
	}
	if len(two.EnginePutGBps) != n || len(two.EngineGetGBps) != n || len(two.PutBatchGBps) != cfg.Batches || len(two.GetBatchGBps) != cfg.Batches {
		t.Fatalf("%d engines: %d/%d per-engine and %d/%d per-batch figures", n, len(two.EnginePutGBps), len(two.EngineGetGBps),
			len(two.PutBatchGBps), len(two.GetBatchGBps))
	}
	for i := range n {
		positive[fmt.Sprintf("engines.engine_put_gbps[%d]", i)] = two.EnginePutGBps[i]
		positive[fmt.Sprintf("engines.engine_get_gbps[%d]", i)] = two.EngineGetGBps[i]
	}
	for name, v := range positive {
		if !(v > 0) {
			t.Errorf("%s = %v, want positive", name, v)
		}
	}
	if rep.MismatchedPages != 0 || two.MismatchedPages != 0 {
		t.Errorf("%d mismatched pages (%d with %d engines)", rep.MismatchedPages, two.MismatchedPages, n)
	}
	// An embedded service is measured once its arena is warmed up, and says so.
	if warmed := strings.Contains(strings.Join(rep.Notes, "\n"), "arena warmed up"); warmed != (cfg.Socket == "") {
		t.Errorf("socket %q, notes %q: the warm-up note should be there exactly for an embedded service", cfg.Socket, rep.Notes)
	}
	if rep.Backend != BackendNode || rep.HostAllocator != "shm" || rep.Stream != "" {
		t.Errorf("backend %q, host allocator %q, stream %q", rep.Backend, rep.HostAllocator, rep.Stream)
	}
	if len(rep.PutBatchGBps) != cfg.Batches || len(rep.GetBatchGBps) != cfg.Batches {
		t.Errorf("%d/%d per-batch figures, want %d", len(rep.PutBatchGBps), len(rep.GetBatchGBps), cfg.Batches)
	}
	if !strings.HasPrefix(rep.Peer, "memcpy, 2 goroutines") || !strings.HasPrefix(two.Peer, "memcpy, ") {
		t.Errorf("peers %q and %q", rep.Peer, two.Peer)
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("table:\n%s", table.String())
	wants := []string{"backend", "node", "peer GB/s", fmt.Sprintf("%d engines", n), "cold batch", "mismatched pages: 0"}
	if n == 2 {
		wants = append(wants, "engine 1", "engine 2")
	} else {
		wants = append(wants, "engine min-max")
	}
	for _, want := range wants {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q", want)
		}
	}
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(data, &fields); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"engines", "cold_put_gbps", "cold_get_gbps", "peer_put_gbps", "exists_p99_us"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
}

// TestRunNodeEndToEnd runs the node backend against an embedded service, with
// Redis when it is installed (the run succeeds without it, and says so).
func TestRunNodeEndToEnd(t *testing.T) {
	cfg := nodeConfig(t)
	withRedis := redisInstalled(t)
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkNodeReport(t, rep, cfg)
	if !strings.HasPrefix(rep.BackendSettings, "embedded service") {
		t.Errorf("settings %q", rep.BackendSettings)
	}
	notes := strings.Join(rep.Notes, "\n")
	if withRedis {
		if !strings.HasPrefix(rep.Redis, "redis-server ") || !(rep.RedisPutGBps > 0) || !(rep.RedisGetGBps > 0) ||
			!(rep.PutVsRedis > 0) || !(rep.GetVsRedis > 0) || len(rep.RedisPutBatchGBps) != cfg.Batches {
			t.Errorf("redis %q: put %v get %v, ratios %v %v", rep.Redis, rep.RedisPutGBps, rep.RedisGetGBps, rep.PutVsRedis, rep.GetVsRedis)
		}
		if strings.Contains(notes, "wrong bytes") {
			t.Errorf("notes: %s", notes)
		}
	} else if rep.Redis != "" || !strings.Contains(notes, "redis: not installed") {
		t.Errorf("redis %q without redis-server; notes %q", rep.Redis, notes)
	}
	if left := scratchLeft(t, cfg.Dir); len(left) != 0 {
		t.Errorf("scratch left behind: %v", left)
	}
}

// TestRunNodeEngines runs the phase of several engines at once with three and
// four engines: each engine's figures, the aggregate against a peer of as many
// goroutines as the machine gives, every page read back checked.
func TestRunNodeEngines(t *testing.T) {
	for _, n := range []int{3, 4} {
		t.Run(fmt.Sprintf("engines=%d", n), func(t *testing.T) {
			cfg := nodeConfig(t)
			cfg.NoRedis, cfg.Engines = true, n
			rep, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			checkNodeReport(t, rep, cfg)
			if !strings.Contains(strings.Join(rep.Notes, "\n"), fmt.Sprintf("%d-engine memcpy peer", n)) {
				t.Errorf("notes do not describe the %d-engine peer: %q", n, rep.Notes)
			}
		})
	}
}

// TestRunNodeWithoutRedis takes the two ways to run without Redis: --no-redis,
// and redis-server not installed (simulated).
func TestRunNodeWithoutRedis(t *testing.T) {
	for _, tc := range []struct {
		name, note string
		edit       func(*Config)
	}{
		{"no-redis", "redis: skipped (--no-redis)", func(c *Config) { c.NoRedis = true }},
		{"not installed", "redis: not installed (apt-get install redis-server)", func(*Config) {
			t.Setenv("PATH", t.TempDir())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := nodeConfig(t)
			cfg.ExistsCalls = 5
			tc.edit(&cfg)
			rep, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Redis != "" || rep.RedisPutGBps != 0 || !strings.Contains(strings.Join(rep.Notes, "\n"), tc.note) {
				t.Errorf("redis %q (%v GB/s), notes %q", rep.Redis, rep.RedisPutGBps, rep.Notes)
			}
			var table bytes.Buffer
			if err := rep.WriteTable(&table); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(table.String(), "redis GB/s") || !strings.Contains(table.String(), tc.note) {
				t.Errorf("table:\n%s", table.String())
			}
		})
	}
}

// TestRunNodeExternalService measures a service the test started, through its
// socket, as `--socket` does.
func TestRunNodeExternalService(t *testing.T) {
	dir, err := os.MkdirTemp("", "st")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	scfg := node.DefaultConfig(filepath.Join(dir, "node.sock"))
	scfg.ArenaBytes = 64 << 20
	scfg.Admin = ""
	scfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := node.New(scfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	cfg := nodeConfig(t)
	cfg.Socket, cfg.NoRedis = srv.Socket(), true
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkNodeReport(t, rep, cfg)
	if rep.BackendSettings != "service at "+srv.Socket() || !strings.Contains(strings.Join(rep.Notes, "\n"), "assume it has 2 copy workers") {
		t.Errorf("settings %q, notes %q", rep.BackendSettings, rep.Notes)
	}
	// The service outlives the run, and holds nothing of it.
	if _, err := os.Stat(srv.Socket()); err != nil {
		t.Errorf("the run removed the service's socket: %v", err)
	}
	if n := srv.Stats().Arena.Objects; n != 0 {
		t.Errorf("the run left %d objects in the service", n)
	}
	// A second run measures puts again (it once found every object there and
	// reported skipped puts as a bandwidth).
	again, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkNodeReport(t, again, cfg)
	// Objects that exist under the run's names are refused, not measured.
	cfg.Namespace, cfg.Keep = "fixed", true
	if _, err := Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(context.Background(), cfg); !errors.Is(err, ErrPutsSkipped) {
		t.Errorf("a run over its own objects: %v, want ErrPutsSkipped", err)
	}
}

func TestRunNodeNoServiceAtSocket(t *testing.T) {
	cfg := nodeConfig(t)
	cfg.Socket, cfg.NoRedis = filepath.Join(t.TempDir(), "none.sock"), true
	_, err := Run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "strata serve --socket") {
		t.Fatalf("Run against no service = %v", err)
	}
}

func TestRunNodeChecksMemory(t *testing.T) {
	cfg := nodeConfig(t)
	cfg.NoRedis = true
	cfg.Available = func() (int64, error) { return 1 << 30, nil } // the allocator's reserve alone
	_, err := Run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "lower --batches") || !errors.Is(err, ErrMemory) || !errors.Is(err, ErrConfig) {
		t.Fatalf("Run without memory = %v, want ErrMemory and ErrConfig naming --batches", err)
	}
}

func TestDefaultShape(t *testing.T) {
	if DefaultShape(BackendFile) != ShapeLlama3 || DefaultShape(BackendNode) != ShapeLlama3P32 {
		t.Fatalf("default shapes %s, %s", DefaultShape(BackendFile), DefaultShape(BackendNode))
	}
	s, err := ShapeByName(ShapeLlama3P32)
	if err != nil {
		t.Fatal(err)
	}
	if s.PageBytes() != 4<<20 || s.PartBytes() != 2<<20 {
		t.Errorf("%s: page %d bytes in parts of %d, want 4 MiB of two 2 MiB parts", s.Name, s.PageBytes(), s.PartBytes())
	}
}
