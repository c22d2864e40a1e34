// Package redisstore stores L3 objects in Redis: a Redis Cluster, where every node
// of a deployment finds the pages any other node wrote, or a single redis-server.
//
// # Layout
//
// Object name (for pools, a page part as storage.ObjectNames spells it, model
// prefix included) is stored as a small header key and one or more chunk keys:
//
//	{name}:h   header: magic, version, storage.Format, body length, the writer's
//	           ChunkBytes, chunk count and the length of every chunk, xxh3-64 of
//	           the whole body, xxh3-64 of the name, and a checksum of the header
//	{name}:0   the body's first chunk, {name}:1 the next, ...
//
// The "{name}" hash tag puts every key of an object on one cluster shard, so one
// object is one shard's business and a batch is one pipeline per shard (go-redis
// groups a cluster pipeline by node and runs the nodes in parallel). A body is cut
// into chunks of at most ChunkBytes (default 4 MiB), so that one GET or SET, and
// the latency and memory spike it causes on its shard, stays bounded; the cut
// follows the runs of host memory (storage.Parts): a run of 64 KiB or more gets
// chunks of its own, so no chunk crosses a run, and only shorter consecutive runs
// (a layer-first pool with small pages) share a chunk through a staging buffer.
//
// # Reads and writes
//
// A read is one pipeline: the header (GETRANGE of at most the largest valid
// header) and every chunk, the chunk bytes going straight from the socket into
// the destination runs (go-redis's ZeroCopyStringCmd, the command behind
// GetToBuffer; no copy on the Go heap). Chunks are read with GETRANGE key 0 n-1
// rather than GET: a GET of a value longer than its buffer makes go-redis fail
// that command and then, unread, every later one on the connection, so one
// damaged chunk would fail the whole batch; GETRANGE never returns more than the
// buffer holds, and costs the same (BenchmarkClients). Then the header is checked
// (format, name, length, cut) and the checksum is computed over the bytes now in
// host memory, on several cores for a large batch. A missing header, or a header
// with a missing chunk (a writer died, Redis evicted or expired a key), is
// storage.ErrNotFound; a damaged header, a short chunk or a checksum mismatch is
// storage.ErrCorrupt. Either way the object's keys are deleted, so the next put
// stores it again; bytes that failed a check are never reported as read. An
// object of another format is a miss and is left alone. An object cut otherwise
// than the reader would cut it (another ChunkBytes, or a pool of another layout
// with the same format) is read again with the header's cut: a second round trip.
//
// A write is write-once: one pipeline reads the headers (and checks that the
// chunks exist); a header in the pool's format with all its chunks means the
// object is stored and nothing is written, a header of another format means the
// name is taken and the put is dropped (counted as a conflict). The others are
// written with a second pipeline: every chunk, then the header last, all with the
// TTL. Redis runs one connection's commands in order, so a reader that sees a
// live writer's header sees its chunks. The chunk values are the host memory
// slices themselves: go-redis writes them to the socket without a copy; the
// checksums are computed while it does. A write that fails half way is removed.
//
// # Faults
//
// A shard that refuses connections, times out, or answers CLUSTERDOWN, TRYAGAIN,
// LOADING or a MOVED that outlives the redirects fails its objects with
// storage.ErrUnavailable (storage.ErrTimeout for a timeout) while the other
// shards' objects in the batch succeed, and is skipped for Config.Backoff (its
// objects are fast misses), doubling to 10 times while it keeps failing; the first
// answer brings it back. An error reply fails the object it answered:
// "OOM command not allowed" (maxmemory with noeviction) is storage.ErrNoSpace,
// others storage.ErrIO.
//
// Run the servers as a cache: maxmemory with an allkeys-lru (or allkeys-lfu)
// policy, and for a cluster cluster-require-full-coverage no, so that a dead
// master costs only its own slots' pages. Eviction may take any key of an
// object; the next read finds the object partial, counts a miss and removes the
// rest.
//
// # Client
//
// go-redis v9 (v9.23.0) and rueidis (v1.0.79) were compared on one local
// redis-server 7.0.15 on the 2-core development machine: one pipeline of 128
// SETs of 4 MiB values, and one of 128 GETs of them, the same bytes and depth
// (BenchmarkClients, -benchtime 8x, ranges over two runs of -count 3):
//
//	SET  go-redis 2.1-2.7 GB/s        rueidis 1.4-1.7 GB/s (copies through its write buffer)
//	GET  go-redis GetToBuffer 0.9-1.1 rueidis DoMulti 0.3-0.75 (a new string per value)
//	     go-redis GETRANGE 0.9-1.1    rueidis DoMultiStream into the caller's buffer 0.9-1.1
//
// go-redis stays. rueidis is slower on SET and no faster on GET; its only way to
// read into a caller's buffer, DoMultiStream, takes a dedicated connection and
// refuses, on a cluster, a pipeline that spans slots, which every batch does.
// The GETs are bound by the server, which copies each value into its reply
// buffers. The store moves a batch at 0.87-0.97 of raw pipelined SET and GET of
// the same bytes over the same client (BenchmarkStorePutGet128, "x-of-raw"); what
// it adds is the write-once check (a round trip of small commands), the headers,
// and the checksums. rueidis is a test-only dependency, for BenchmarkClients.
package redisstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// Store is a storage.Backend over Redis, with an object API for callers that hold
// bytes rather than pool pages (the node service). It is safe for concurrent use.
type Store struct {
	cfg     Config
	mode    string
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient // nil for a standalone server
	single  *shard               // the standalone server's shard
	shards  shards
	stats   counters
	bufs    sync.Pool // *[]byte staging buffers

	mu       sync.RWMutex // guards pools and closed
	pools    map[string]*poolState
	closed   bool
	inflight sync.WaitGroup
}

var _ storage.Backend = (*Store)(nil)

// poolState is a registered pool.
type poolState struct {
	spec   storage.PoolSpec
	names  pagekey.Names // spec.Names with MLA from the layout
	format storage.Format
	parts  int
	// plans is each part's chunk cut: the same for every page of the pool.
	plans [][]int64
	sizes []int64
}

// New connects to the servers of cfg, detects a cluster or a standalone server
// (unless cfg.Mode says which), and checks that they answer PING. A server that
// cannot be reached is an error wrapping storage.ErrUnavailable; for a cluster,
// masters that are down when New runs are only logged (they are skipped until
// they answer), as long as one node answers.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.DialTimeout+cfg.CallTimeout)
		defer cancel()
	}
	s := &Store{
		cfg:    cfg,
		mode:   cfg.Mode,
		shards: shards{backoff: cfg.Backoff, log: cfg.Logger, now: cfg.now, all: map[string]*shard{}},
		pools:  map[string]*poolState{},
	}
	if s.mode == ModeAuto {
		mode, err := detect(ctx, cfg)
		if err != nil {
			return nil, err
		}
		s.mode = mode
	}
	if s.mode == ModeStandalone && len(cfg.Addrs) != 1 {
		return nil, fmt.Errorf("redis store: %s is a standalone server (cluster_enabled:0), and standalone mode takes one address, got %q; list only it, or run a Redis Cluster: %w",
			cfg.Addrs[0], cfg.Addrs, storage.ErrConfig)
	}
	if s.mode == ModeCluster {
		s.cluster = redis.NewClusterClient(clusterOptions(cfg))
		s.rdb = s.cluster
	} else {
		s.rdb = redis.NewClient(clientOptions(cfg, cfg.Addrs[0]))
		s.single = s.shards.get(cfg.Addrs[0])
	}
	if err := s.check(ctx); err != nil {
		_ = s.rdb.Close()
		return nil, err
	}
	return s, nil
}

func clientOptions(cfg Config, addr string) *redis.Options {
	return &redis.Options{
		Addr:            addr,
		Username:        cfg.Username,
		Password:        cfg.Password,
		TLSConfig:       cfg.TLS,
		DialTimeout:     cfg.DialTimeout,
		DialerRetries:   1, // a refused dial is a shard down; the store's backoff takes over
		MaxRetries:      -1,
		PoolSize:        cfg.PoolSize,
		PoolTimeout:     cfg.CallTimeout,
		DisableIdentity: true,
		// Deadlines come from the call's context (CallTimeout or earlier), for the
		// whole pipeline rather than per socket read.
		ReadTimeout:              -1,
		WriteTimeout:             -1,
		ContextTimeoutEnabled:    true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}

func clusterOptions(cfg Config) *redis.ClusterOptions {
	return &redis.ClusterOptions{
		Addrs:                    cfg.Addrs,
		Username:                 cfg.Username,
		Password:                 cfg.Password,
		TLSConfig:                cfg.TLS,
		DialTimeout:              cfg.DialTimeout,
		DialerRetries:            1,
		MaxRetries:               -1,
		MaxRedirects:             3,
		PoolSize:                 cfg.PoolSize,
		PoolTimeout:              cfg.CallTimeout,
		DisableIdentity:          true,
		ReadTimeout:              -1,
		WriteTimeout:             -1,
		ContextTimeoutEnabled:    true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}

// detect asks the seeds, in order, whether they run in cluster mode.
func detect(ctx context.Context, cfg Config) (string, error) {
	var errs []error
	for _, addr := range cfg.Addrs {
		c := redis.NewClient(clientOptions(cfg, addr))
		info, err := c.Info(ctx, "cluster").Result()
		_ = c.Close()
		if err != nil {
			if redis.IsAuthError(err) || redis.IsPermissionError(err) {
				return "", fmt.Errorf("redis store: %s refused the credentials: %v; give the credentials of an ACL user allowed GET, SET, DEL, EXISTS, GETRANGE, INFO and CLUSTER (strata serve --remote-username, --remote-password-file): %w",
					addr, err, storage.ErrConfig)
			}
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
			continue
		}
		sc := bufio.NewScanner(strings.NewReader(info))
		for sc.Scan() {
			if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "cluster_enabled:"); ok && v == "1" {
				return ModeCluster, nil
			}
		}
		return ModeStandalone, nil
	}
	return "", fmt.Errorf("redis store: cannot reach any of %q (%w); start redis-server there or fix the addresses (strata bench --redis, strata serve --remote): %w",
		cfg.Addrs, errors.Join(errs...), storage.ErrUnavailable)
}

// check pings the server, or every master of the cluster.
func (s *Store) check(ctx context.Context) error {
	if s.cluster == nil {
		if err := s.rdb.Ping(ctx).Err(); err != nil {
			if redis.IsAuthError(err) {
				return fmt.Errorf("redis store: %s refused the credentials: %v; give the right credentials (strata serve --remote-username, --remote-password-file): %w", s.cfg.Addrs[0], err, storage.ErrConfig)
			}
			return fmt.Errorf("redis store: %s does not answer PING (%w); start redis-server there or fix the addresses (strata bench --redis, strata serve --remote): %w", s.cfg.Addrs[0], err, storage.ErrUnavailable)
		}
		if info, err := s.rdb.Info(ctx, "cluster").Result(); err == nil && strings.Contains(info, "cluster_enabled:1") {
			return fmt.Errorf("redis store: %s is a Redis Cluster node; use Mode %q or %q, or most keys will be redirected: %w",
				s.cfg.Addrs[0], ModeCluster, ModeAuto, storage.ErrConfig)
		}
		return nil
	}
	var mu sync.Mutex
	var up, down int
	err := s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		err := c.Ping(ctx).Err()
		mu.Lock()
		defer mu.Unlock()
		sh := s.shards.get(c.Options().Addr)
		if err != nil {
			down++
			s.shards.failed(sh, err)
			return nil
		}
		up++
		return nil
	})
	switch {
	case err != nil && up == 0:
		if redis.IsAuthError(err) {
			return fmt.Errorf("redis store: the cluster at %q refused the credentials: %v; give the right credentials (strata serve --remote-username, --remote-password-file): %w", s.cfg.Addrs, err, storage.ErrConfig)
		}
		return fmt.Errorf("redis store: cannot load the cluster's slots from %q (%w); check that the nodes run with cluster-enabled yes and the cluster is formed (redis-cli --cluster create): %w",
			s.cfg.Addrs, err, storage.ErrUnavailable)
	case up == 0:
		return fmt.Errorf("redis store: no master of the cluster at %q answers PING: %w", s.cfg.Addrs, storage.ErrUnavailable)
	}
	return nil
}

// Name is "redis".
func (s *Store) Name() string { return "redis" }

// Mode is ModeCluster or ModeStandalone.
func (s *Store) Mode() string { return s.mode }

// Client is the store's go-redis client (a *redis.ClusterClient in cluster mode,
// a *redis.Client otherwise), for administration and for benchmarks that hold the
// store against raw commands on the same connections. Keys written through it in
// the store's layout bypass its checksums; the store closes it.
func (s *Store) Client() redis.UniversalClient { return s.rdb }

// Allocator is "": pages move through sockets from and to any host memory.
func (s *Store) Allocator() hostmem.Kind { return "" }

// RegisterPool checks spec and makes the pool available to Exists, Get and Put.
// Registering a name again replaces the earlier registration.
func (s *Store) RegisterPool(ctx context.Context, spec storage.PoolSpec) error {
	if err := ctx.Err(); err != nil {
		return ctxError("register pool "+spec.Name, err)
	}
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("redis store: register: %w", err)
	}
	names := spec.Names
	names.MLA = spec.Layout.Geometry.MLA
	ps := &poolState{spec: spec, names: names, format: storage.FormatOf(spec.Layout), parts: spec.Layout.Geometry.Buffers()}
	mem := spec.Region.Bytes()
	for _, span := range storage.Parts(spec, 0) {
		runs := spanRuns(mem, span, nil)
		plan, err := cutPlan(runs, s.cfg.ChunkBytes)
		if err != nil {
			return fmt.Errorf("redis store: register pool %q: %w: %w", spec.Name, err, storage.ErrConfig)
		}
		ps.plans = append(ps.plans, plan)
		ps.sizes = append(ps.sizes, runsLen(runs))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("redis store: register pool %q: %w", spec.Name, storage.ErrClosed)
	}
	s.pools[spec.Name] = ps
	return nil
}

// Exists reports how many of keys, from the start, have every part of their object
// stored in the pool's format with all its chunks: one pipeline of header reads
// and EXISTS. A corrupt or partial object found on the way is removed and counts
// as missing.
func (s *Store) Exists(ctx context.Context, poolName string, keys []pagekey.Key) (int, error) {
	ps, done, err := s.admit(poolName, "exists", func(*poolState) error { return storage.CheckKeys(keys) })
	if err != nil {
		s.stats.fault(err)
		return 0, err
	}
	defer done()
	ops := make([]*op, 0, len(keys)*ps.parts)
	for _, k := range keys {
		for part := 0; part < ps.parts; part++ {
			ops = append(ops, &op{name: ps.names.Object(k, ps.spec.Name, part), format: ps.format, size: ps.sizes[part], plan: ps.plans[part]})
		}
	}
	b := s.newBatch(ctx, "exists", ops)
	defer b.end()
	b.exists()
	for i := range keys {
		for part := 0; part < ps.parts; part++ {
			o := ops[i*ps.parts+part]
			if o.err != nil && !errors.Is(o.err, storage.ErrNotFound) {
				return i, o.err
			}
			if o.err != nil || o.state != present {
				return i, nil
			}
		}
	}
	return len(keys), nil
}

// Get reads the objects of keys into the pool's pages with one pipeline (two when
// an object was cut otherwise), verifying every object's checksum over the bytes
// in host memory.
func (s *Store) Get(ctx context.Context, poolName string, keys []pagekey.Key, pages []pool.PageID) []error {
	ps, ops, done, errs := s.pageOps(poolName, "get", keys, pages)
	if errs != nil {
		return errs
	}
	defer done()
	b := s.newBatch(ctx, "get", ops)
	defer b.end()
	b.get()
	return s.perKey(ops, len(keys), ps.parts)
}

// Put writes the pool's pages as the objects of keys, write-once: an object
// already stored (in any format) is left as it is and counts as a success.
func (s *Store) Put(ctx context.Context, poolName string, keys []pagekey.Key, pages []pool.PageID) []error {
	ps, ops, done, errs := s.pageOps(poolName, "put", keys, pages)
	if errs != nil {
		return errs
	}
	defer done()
	b := s.newBatch(ctx, "put", ops)
	defer b.end()
	b.put()
	return s.perKey(ops, len(keys), ps.parts)
}

// pageOps admits a Get or Put and makes its objects, or returns every key's error.
func (s *Store) pageOps(poolName, what string, keys []pagekey.Key, pages []pool.PageID) (*poolState, []*op, func(), []error) {
	ps, done, err := s.admit(poolName, what, func(ps *poolState) error { return storage.CheckBatch(ps.spec, keys, pages) })
	if err != nil {
		return nil, nil, nil, s.failAll(len(keys), err)
	}
	mem := ps.spec.Region.Bytes()
	ops := make([]*op, 0, len(keys)*ps.parts)
	for i, k := range keys {
		for part, span := range storage.Parts(ps.spec, pages[i]) {
			ops = append(ops, &op{
				name: ps.names.Object(k, ps.spec.Name, part), format: ps.format,
				runs: spanRuns(mem, span, nil), size: ps.sizes[part], plan: ps.plans[part],
			})
		}
	}
	return ps, ops, done, nil
}

// perKey folds the results of each key's parts into one: a fault outranks a miss.
func (s *Store) perKey(ops []*op, keys, parts int) []error {
	out := make([]error, keys)
	for i, o := range ops {
		k := i / parts
		if out[k] == nil || (o.err != nil && errors.Is(out[k], storage.ErrNotFound) && !errors.Is(o.err, storage.ErrNotFound)) {
			out[k] = o.err
		}
	}
	return out
}

func (s *Store) failAll(n int, err error) []error {
	out := storage.FailAll(n, err)
	for _, e := range out {
		s.stats.fault(e)
	}
	return out
}

// Close makes later calls fail with storage.ErrClosed, waits for the calls in
// flight and closes the connections. Closing twice is fine.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.inflight.Wait()
	if err := s.rdb.Close(); err != nil && !errors.Is(err, redis.ErrClosed) {
		return fmt.Errorf("redis store: close: %w", err)
	}
	return nil
}

// spanRuns appends the runs of span in mem to dst; a contiguous span is one run.
func spanRuns(mem []byte, span kvlayout.Span, dst [][]byte) [][]byte {
	if span.Contiguous() {
		end := span.Offset + span.Bytes()
		return append(dst, mem[span.Offset:end:end])
	}
	for r := 0; r < span.Count; r++ {
		base := span.Offset + int64(r)*span.Stride
		end := base + span.RunBytes
		dst = append(dst, mem[base:end:end])
	}
	return dst
}
