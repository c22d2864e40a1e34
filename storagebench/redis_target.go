package storagebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/internal/redisproc"
	"github.com/stratakv/strata/storage"
	"github.com/stratakv/strata/storage/redisstore"
)

// redisLocalMasters is the size of the local cluster of a RedisCluster run.
const redisLocalMasters = 3

// redisKeepTTL is how long the objects of a run on a Redis the user gave live
// without Keep: they clean themselves up, and the TTL costs the store and the raw
// pipeline the same (one SET option).
const redisKeepTTL = time.Hour

// RedisTarget measures storage/redisstore against raw pipelines of the same
// client: the peer is the same go-redis client type with the same options (a
// second store's own client) on the same servers, storing the same part bytes
// with one pipeline of SETs per batch and reading them with one of GETs into the
// pages, the raw commands the store is built on. The ratio is what the store's
// layout (a checksummed header key beside each value), its per-shard pipelines and
// its verification cost over Redis alone.
//
// With s.Redis empty it starts its own Redis in the scratch directory: one
// redis-server, or a cluster of 3 masters with s.RedisCluster. On a Redis of the
// user's, the store's objects expire an hour after the run unless s.Keep, and the
// peer deletes its keys.
func RedisTarget(s Scratch) (t Target, err error) {
	avail := s.Available
	if avail == nil {
		avail = hostmem.AvailableBytes
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	t = Target{Name: BackendRedis, PerBatch: true}
	var closers cleanups
	defer func() {
		if err != nil {
			_ = closers.run()
		}
	}()
	t.Close = closers.run

	addrs := s.Redis
	ttl := time.Duration(0)
	if len(addrs) == 0 {
		if err := redisproc.Installed(); err != nil {
			return Target{}, fmt.Errorf("the redis backend needs a Redis (%v): give --redis host:port of a server or cluster node, or install redis-server and the run starts one: %w", err, ErrConfig)
		}
		// Redis holds one batch of the store's and one of the peer's at a time
		// (PerBatch), each value in a jemalloc size class up to a quarter over its
		// size; the host pools and the client's buffers come on top.
		need := 3*s.BatchBytes + 4*s.BatchBytes + hostmem.DefaultConfig(hostmem.Mmap).ReserveBytes
		if a, aerr := avail(); aerr == nil && a < need {
			return Target{}, fmt.Errorf("the redis run needs %s of host memory (Redis holding a batch twice, host pools) and %s is available: lower --pages-per-batch: %w",
				formatBytes(need), formatBytes(a), ErrConfig)
		}
		dir := filepath.Join(s.Dir, "redis")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return Target{}, fmt.Errorf("redis directory: %w", err)
		}
		if s.RedisCluster {
			if s.Progress != nil {
				s.Progress("starting a Redis Cluster of %d masters on loopback", redisLocalMasters)
			}
			c, err := redisproc.StartCluster(dir, redisLocalMasters)
			if err != nil {
				return Target{}, err
			}
			closers.add(func() error { c.Stop(); return nil })
			addrs = c.Addrs()
			t.Describe = fmt.Sprintf("local cluster of %d masters started for the run (%s)", redisLocalMasters, strings.Join(addrs, ", "))
		} else {
			if s.Progress != nil {
				s.Progress("starting redis-server on loopback")
			}
			srv, err := redisproc.Start(dir, "--maxmemory", "0")
			if err != nil {
				return Target{}, err
			}
			closers.add(func() error { srv.Stop(); return nil })
			addrs = []string{srv.Addr()}
			t.Describe = "local redis-server started for the run (" + srv.Addr() + ")"
		}
	} else {
		t.Describe = "Redis at " + strings.Join(addrs, ", ")
		if !s.Keep {
			ttl = redisKeepTTL
			t.Notes = append(t.Notes, fmt.Sprintf("the store's objects expire %v after they are written (--keep keeps them); the raw pipeline's keys are deleted after the run", redisKeepTTL))
		}
	}

	cfg := redisstore.DefaultConfig(addrs...)
	cfg.CallTimeout = 5 * time.Minute // a batch moves 512 MiB or more
	cfg.TTL = ttl
	cfg.Logger = quiet
	t.New = func(ctx context.Context) (storage.Backend, error) {
		st, err := redisstore.New(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return st, nil
	}
	// The peer's client is a second store's: the same type and options, its own
	// connections, so neither waits for the other's pool.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	peerStore, err := redisstore.New(ctx, cfg)
	if err != nil {
		return Target{}, fmt.Errorf("open the raw pipeline's client: %w", err)
	}
	closers.add(peerStore.Close)
	version, err := redisVersion(ctx, peerStore.Client())
	if err != nil {
		return Target{}, fmt.Errorf("redis at %v: %w", addrs, err)
	}
	t.Describe += fmt.Sprintf(", redis %s, %s mode, %s chunks", version, peerStore.Mode(), formatBytes(cfg.ChunkBytes))
	t.Peer = NewRedisPeer(peerStore.Client(),
		fmt.Sprintf("raw pipelined SET, pipelined GET into the pages, same go-redis v9 client and options (%s mode), one pipeline per batch", peerStore.Mode()),
		fmt.Sprintf("strata-bench-raw-%d-", os.Getpid()), ttl)
	t.Forget = func(ctx context.Context, names []string) error {
		var errs []error
		for _, name := range names {
			if _, err := peerStore.RemoveObject(ctx, name); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(append(errs, t.Peer.(*RedisPeer).forget(ctx, names))...)
	}
	t.Notes = append(t.Notes, "the store writes a small checksummed header key beside each value and checks it on every read; "+
		"the raw pipeline stores the bare values: the ratio is what that safety costs",
		"each batch is read back right after it is put and removed before the next (the last stays for the exists calls), "+
			"so Redis holds one batch of each at a time: a run that grew it by every batch would time its page faults on fresh memory")
	return t, nil
}
