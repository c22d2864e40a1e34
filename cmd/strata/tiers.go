package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/stratakv/strata/storagebench"
)

// runTiers is `strata bench tiers`: the storage micro-benchmark. It puts and gets
// batches of pages through an L3 backend and prints each direction beside the
// physical limit of the same job measured in the same run: for the file backend
// the disk's own figure, for the node service a plain memcpy of the same bytes
// (and a Redis server on loopback storing the same objects, and two or
// --engines engines at once).
func runTiers(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	def := storagebench.DefaultConfig()
	fs := newFlagSet("bench tiers", stdout)
	backend := fs.String("backend", def.Backend, "L3 backend to measure: "+strings.Join(storagebench.Backends(), ", "))
	socket := fs.String("socket", "", "node backend: socket of a running node service to measure (default: start one in the process, sized for the run)")
	noRedis := fs.Bool("no-redis", false, "node backend: do not measure a redis-server on loopback beside it")
	redisAddrs := fs.String("redis", "", "redis backend: Redis Cluster node(s) or server to measure, host:port,... (default: start a redis-server for the run)")
	redisCluster := fs.Bool("redis-cluster", false, "redis backend: start a local cluster of 3 masters instead of one redis-server")
	dir := fs.String("dir", "", "directory on the disk to measure; the run works in a fresh subdirectory (default: the system temp directory)")
	keep := fs.Bool("keep", false, "keep the scratch subdirectory and the store's objects")
	batches := fs.Int("batches", def.Batches, "batches to put and read back, each with distinct keys")
	perBatch := fs.Int("pages-per-batch", def.PagesPerBatch, "pages per put and get call")
	geometry := fs.String("geometry", "", "page shape: "+strings.Join(storagebench.ShapeNames(), ", ")+
		" (default "+storagebench.DefaultShape(storagebench.BackendFile)+" for file, "+storagebench.DefaultShape(storagebench.BackendNode)+" for node)")
	objectBytes := fs.Int64("object-bytes", 0, fmt.Sprintf("measure small objects instead of pages: pages of two objects of this many bytes (a multiple of %d, %d to %d), "+
		"e.g. 1024 with --batches 200 for per-object costs against Redis", storagebench.MinObjectBytes, storagebench.MinObjectBytes, storagebench.MaxObjectBytes))
	small := fs.Bool("small", false, "quick smoke run: the small page shape (same as --geometry "+storagebench.ShapeSmall+")")
	engines := fs.Int("engines", def.Engines, fmt.Sprintf("node backend: engines (clients with host pools of their own) that put and get at once in the last phase, 2 to %d, "+
		"against a memcpy of as many goroutines as they have copy workers (at most the machine's cores)", storagebench.MaxEngines))
	exists := fs.Int("exists-calls", def.ExistsCalls, "exists calls timed for the lookup latency")
	seed := fs.Uint64("seed", def.Seed, "seed of the tokens and page contents")
	jsonPath := fs.String("json", "", "write the report as JSON to this file")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg := def
	cfg.Backend, cfg.Dir, cfg.Keep = *backend, *dir, *keep
	cfg.Batches, cfg.PagesPerBatch, cfg.ExistsCalls, cfg.Seed = *batches, *perBatch, *exists, *seed
	cfg.Shape, cfg.ObjectBytes = *geometry, *objectBytes
	cfg.Socket, cfg.NoRedis, cfg.Engines = *socket, *noRedis, *engines
	cfg.Redis, cfg.RedisCluster = splitList(*redisAddrs), *redisCluster
	if err := refuseInapplicable(fs, tiersFlagScopes(cfg.Backend)); err != nil {
		return err
	}
	if *small {
		if flagSet(fs, "object-bytes") {
			return usagef("--small and --object-bytes disagree; give one")
		}
		if flagSet(fs, "geometry") && *geometry != storagebench.ShapeSmall {
			return usagef("--small and --geometry %s disagree; give one", *geometry)
		}
		cfg.Shape = storagebench.ShapeSmall
	}
	if err := cfg.Validate(); err != nil {
		return usageError{tiersFlagError(err)}
	}
	if cfg.Dir != "" {
		if st, err := os.Stat(cfg.Dir); err != nil {
			return usagef("--dir: %w", err)
		} else if !st.IsDir() {
			return usagef("--dir %s: not a directory", cfg.Dir)
		}
	}
	// Paths and addresses are checked before the run, not after it.
	if *jsonPath != "" {
		if err := checkOutputFile(*jsonPath); err != nil {
			return usagef("--json: %w", err)
		}
	}
	if cfg.Socket != "" {
		if err := checkSocket(ctx, cfg.Socket); err != nil {
			return usagef("--socket: %w", err)
		}
	}
	if len(cfg.Redis) > 0 {
		if err := checkTCP(ctx, cfg.Redis); err != nil {
			return usagef("--redis: %w", err)
		}
	}
	cfg.Progress = stderr
	rep, err := storagebench.Run(ctx, cfg)
	// Without --batches, the run sizes itself to the machine: fewer batches until
	// it fits the available memory.
	for errors.Is(err, storagebench.ErrMemory) && !flagSet(fs, "batches") && cfg.Batches > 1 {
		fmt.Fprintf(stderr, "bench tiers: %d batches do not fit this machine's memory; running %d (set --batches to choose)\n", cfg.Batches, cfg.Batches/2)
		cfg.Batches /= 2
		rep, err = storagebench.Run(ctx, cfg)
	}
	if err != nil {
		if errors.Is(err, storagebench.ErrConfig) {
			return usageError{err}
		}
		return err
	}
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	if *jsonPath != "" {
		if err := rep.WriteJSON(*jsonPath); err != nil {
			return fmt.Errorf("--json: %w", err)
		}
	}
	if rep.MismatchedPages > 0 {
		return fmt.Errorf("the %s backend returned %d pages whose bytes differ from what was put", rep.Backend, rep.MismatchedPages)
	}
	return nil
}

// tiersFlagError names the flag a configuration error comes from.
func tiersFlagError(err error) error {
	msg := err.Error()
	for _, f := range []struct{ frag, flag string }{
		{"redis settings", "--redis"},
		{"local redis cluster", "--redis and --redis-cluster"},
		{"object size", "--object-bytes"},
		{"backend", "--backend"},
		{"page shape", "--geometry"},
		{"pages per batch", "--pages-per-batch"},
		{"batches", "--batches"},
		{"exists calls", "--exists-calls"},
		{"engines at once", "--engines"},
	} {
		if strings.Contains(msg, f.frag) {
			return fmt.Errorf("%s: %w", f.flag, err)
		}
	}
	return err
}
