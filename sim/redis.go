package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/stratakv/strata/internal/redisproc"
	"github.com/stratakv/strata/storage/redisstore"
)

// localRedisMasters is the size of the cluster the bench starts when it is given
// no Redis: the smallest that redis-cli --cluster create forms, and enough to
// spread keys over shards as a deployment does.
const localRedisMasters = 3

// localRedisMaxMemory bounds each master of that cluster, with allkeys-lru: a
// long bench evicts old pages (misses, as in production) instead of filling the
// machine's memory.
const localRedisMaxMemory = "2gb"

// startLocalRedis starts a Redis Cluster of localRedisMasters masters on loopback
// in a temporary directory, for one bench; stop stops it and removes the directory.
func startLocalRedis(log *slog.Logger) (addrs []string, stop func() error, err error) {
	if err := redisproc.Installed(); err != nil {
		return nil, nil, fmt.Errorf("this bench needs Redis (%v): give --redis host:port of a Redis Cluster node or server, "+
			"or install redis-server and the bench starts a local cluster itself: %w", err, ErrConfig)
	}
	dir, err := os.MkdirTemp("", "strata-redis-")
	if err != nil {
		return nil, nil, fmt.Errorf("local Redis directory: %w", err)
	}
	start := time.Now()
	c, err := redisproc.StartCluster(dir, localRedisMasters,
		"--maxmemory", localRedisMaxMemory, "--maxmemory-policy", "allkeys-lru")
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("start a local Redis Cluster: %w", err), os.RemoveAll(dir))
	}
	log.Info("started a local Redis Cluster for the bench", "addrs", c.Addrs(), "took", time.Since(start).Round(time.Millisecond))
	return c.Addrs(), func() error { c.Stop(); return os.RemoveAll(dir) }, nil
}

// openRedis connects to the Redis at cfg.Redis as an L3 backend.
func openRedis(cfg Config, log *slog.Logger) (*redisstore.Store, error) {
	rc := redisstore.DefaultConfig(cfg.Redis...)
	rc.Logger = log
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := redisstore.New(ctx, rc)
	if err != nil {
		return nil, fmt.Errorf("redis at %v: %w", cfg.Redis, err)
	}
	return st, nil
}
