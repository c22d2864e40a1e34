package storagebench

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/stratakv/strata/internal/redistest"
)

func redisConfig(t *testing.T) Config {
	t.Helper()
	cfg := tinyConfig(t)
	cfg.Backend = BackendRedis
	cfg.Batches = 3
	return cfg
}

// checkRedisReport checks what every redis run reports, timing aside.
func checkRedisReport(t *testing.T, rep *Report) {
	t.Helper()
	for name, v := range map[string]float64{
		"put_gbps": rep.PutGBps, "get_gbps": rep.GetGBps, "peer_put_gbps": rep.PeerPutGBps, "peer_get_gbps": rep.PeerGetGBps,
		"put_ratio": rep.PutRatio, "get_ratio": rep.GetRatio, "exists_p50_us": rep.ExistsP50us,
	} {
		if !(v > 0) {
			t.Errorf("%s = %v, want positive", name, v)
		}
	}
	if rep.Backend != BackendRedis || rep.MismatchedPages != 0 || len(rep.PutBatchGBps) != 3 || len(rep.GetBatchGBps) != 3 {
		t.Errorf("backend %q, %d mismatched, %d/%d batch figures", rep.Backend, rep.MismatchedPages, len(rep.PutBatchGBps), len(rep.GetBatchGBps))
	}
	if !strings.Contains(rep.Peer, "raw pipelined SET") || strings.Contains(strings.Join(rep.Notes, "\n"), "fewer keys") {
		t.Errorf("peer %q, notes %q", rep.Peer, rep.Notes)
	}
}

// TestRunRedisLocal runs the redis backend on the redis-server it starts itself,
// and on a local cluster.
func TestRunRedisLocal(t *testing.T) {
	redistest.Require(t)
	for _, cluster := range []bool{false, true} {
		t.Run("cluster="+strconv.FormatBool(cluster), func(t *testing.T) {
			if cluster && testing.Short() {
				t.Skip("starts a cluster")
			}
			cfg := redisConfig(t)
			cfg.RedisCluster = cluster
			rep, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			checkRedisReport(t, rep)
			want := "standalone mode"
			if cluster {
				want = "cluster mode"
			}
			if !strings.HasPrefix(rep.BackendSettings, "local ") || !strings.Contains(rep.BackendSettings, want) {
				t.Errorf("settings %q", rep.BackendSettings)
			}
			if left := scratchLeft(t, cfg.Dir); len(left) != 0 {
				t.Errorf("scratch left behind: %v", left)
			}
		})
	}
}

// TestRunRedisGiven measures a server the test started, as --redis does: the
// peer's keys are deleted afterwards, and of the store's objects only the last
// batch's stay (it answered the exists calls), with a TTL.
func TestRunRedisGiven(t *testing.T) {
	srv := redistest.Start(t)
	cfg := redisConfig(t)
	cfg.Redis = []string{srv.Addr()}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkRedisReport(t, rep)
	if !strings.HasPrefix(rep.BackendSettings, "Redis at "+srv.Addr()) {
		t.Errorf("settings %q", rep.BackendSettings)
	}
	keys, err := srv.Do("KEYS", "*")
	if err != nil {
		t.Fatal(err)
	}
	left := strings.Fields(keys)
	// One batch of pages of two parts, each a header and one chunk.
	if want := cfg.PagesPerBatch * 2 * 2; len(left) != want {
		t.Fatalf("%d keys left, want %d (the last batch's objects): %v", len(left), want, left)
	}
	for _, k := range left {
		if !strings.HasPrefix(k, "{") {
			t.Fatalf("key %q left behind is not one of the store's", k)
		}
		if ttl, err := srv.Do("PTTL", k); err != nil || ttl == "-1" {
			t.Fatalf("key %s has no TTL: %q %v", k, ttl, err)
		}
	}
}

func TestRunRedisConfigErrors(t *testing.T) {
	for _, edit := range []func(*Config){
		func(c *Config) { c.Backend = BackendNode; c.Redis = []string{"127.0.0.1:1"} },
		func(c *Config) { c.Backend = BackendFile; c.RedisCluster = true },
		func(c *Config) { c.Redis = []string{"127.0.0.1:1"}; c.RedisCluster = true },
	} {
		cfg := redisConfig(t)
		edit(&cfg)
		if err := cfg.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
	// Nothing listens on the address: an error that names it.
	cfg := redisConfig(t)
	cfg.Redis = []string{"127.0.0.1:1"}
	if _, err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("run on a dead address: %v", err)
	}
	// Not installed and none given: ErrConfig that says what to do.
	t.Setenv("PATH", t.TempDir())
	cfg = redisConfig(t)
	if _, err := Run(context.Background(), cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "--redis") {
		t.Fatalf("run without Redis: %v", err)
	}
}
