package redisstore

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/stratakv/strata/storage"
)

// Modes of Config.Mode.
const (
	// ModeAuto asks the first reachable seed whether it runs with cluster_enabled.
	ModeAuto = "auto"
	// ModeCluster talks to a Redis Cluster: keys are spread over its masters by slot.
	ModeCluster = "cluster"
	// ModeStandalone talks to one redis-server.
	ModeStandalone = "standalone"
)

// Config places and tunes a Redis store. The zero value is not valid; start from
// DefaultConfig.
type Config struct {
	// Addrs are seed addresses (host:port). For a cluster, any reachable master or
	// replica is enough to learn the rest; a standalone server takes exactly one.
	Addrs []string `json:"addrs"`
	// Mode is ModeAuto (detect with INFO cluster), ModeCluster or ModeStandalone.
	// "" means ModeAuto.
	Mode string `json:"mode"`
	// Username and Password authenticate with AUTH (ACL user, or the default user's
	// requirepass when Username is empty).
	Username string `json:"username,omitempty"`
	Password string `json:"-"`
	// TLS, when set, is the TLS configuration of every connection (managed Redis
	// services require it); nil talks plain TCP.
	TLS *tls.Config `json:"-"`
	// ChunkBytes bounds one value: an object part larger than this is stored as
	// several chunk keys, so that one GET or SET, and the latency and memory spike
	// it causes on its shard, stays bounded. 0 means 4 MiB. Readers with another
	// ChunkBytes still read objects written with this one (the header records the
	// cut), at the cost of a second round trip.
	ChunkBytes int64 `json:"chunkBytes"`
	// TTL expires every key of an object this long after it was written; 0 keeps
	// objects until Redis evicts them (set maxmemory and an allkeys-* policy on
	// the servers: a cache that never forgets fills the servers and then fails
	// every put with storage.ErrNoSpace).
	TTL time.Duration `json:"ttl"`
	// CallTimeout bounds each Exists, Get, Put and object call whose context has
	// no earlier deadline. Size it to the largest batch at the slowest expected
	// bandwidth (128 pages of 8 MiB at 1 GB/s is a second). 0 means 2 s.
	CallTimeout time.Duration `json:"callTimeout"`
	// DialTimeout bounds opening a connection. 0 means 1 s.
	DialTimeout time.Duration `json:"dialTimeout"`
	// PoolSize is the connections kept per server; one batch in flight uses one
	// per shard it touches. 0 means go-redis's default (10 per CPU).
	PoolSize int `json:"poolSize"`
	// Backoff is how long a shard that failed (refused a connection, timed out,
	// answered CLUSTERDOWN) is skipped: its keys are fast misses with
	// storage.ErrUnavailable meanwhile. The pause doubles with each failure that
	// follows, up to 10 times Backoff, and ends with the first success. 0 means 1 s.
	Backoff time.Duration `json:"backoff"`
	// Logger receives shard down and up transitions. Nil means slog.Default().
	Logger *slog.Logger `json:"-"`

	// now is the clock that times shard backoffs; nil means time.Now. Tests set
	// it to a clock they advance themselves.
	now func() time.Time
}

// Defaults of the Config fields left zero.
const (
	DefaultChunkBytes  = 4 << 20
	DefaultCallTimeout = 2 * time.Second
	DefaultDialTimeout = time.Second
	DefaultBackoff     = time.Second
)

// DefaultConfig returns a Config for the servers at addrs, detecting cluster or
// standalone, with 4 MiB chunks, no TTL, 2 s calls and 1 s shard backoff.
func DefaultConfig(addrs ...string) Config {
	return Config{
		Addrs:       addrs,
		Mode:        ModeAuto,
		ChunkBytes:  DefaultChunkBytes,
		CallTimeout: DefaultCallTimeout,
		DialTimeout: DefaultDialTimeout,
		Backoff:     DefaultBackoff,
	}
}

// validate checks c and fills its defaults.
func (c *Config) validate() error {
	if len(c.Addrs) == 0 {
		return fmt.Errorf("redis store: no server address; give host:port of a redis-server or of cluster nodes (strata bench --redis, strata serve --remote): %w", storage.ErrConfig)
	}
	for _, a := range c.Addrs {
		if a == "" {
			return fmt.Errorf("redis store: empty address in %q: %w", c.Addrs, storage.ErrConfig)
		}
	}
	switch c.Mode {
	case "":
		c.Mode = ModeAuto
	case ModeAuto, ModeCluster:
	case ModeStandalone:
		if len(c.Addrs) != 1 {
			return fmt.Errorf("redis store: standalone mode takes one address, got %d (%q); for several servers run a Redis Cluster: %w",
				len(c.Addrs), c.Addrs, storage.ErrConfig)
		}
	default:
		return fmt.Errorf("redis store: mode %q: want %q, %q or %q: %w", c.Mode, ModeAuto, ModeCluster, ModeStandalone, storage.ErrConfig)
	}
	if c.ChunkBytes == 0 {
		c.ChunkBytes = DefaultChunkBytes
	}
	if c.ChunkBytes < minChunkBytes || c.ChunkBytes > maxChunkBytes {
		return fmt.Errorf("redis store: chunk of %d bytes, want %d to %d (Redis caps a value at 512 MiB; a few MiB keeps shards responsive): %w",
			c.ChunkBytes, minChunkBytes, maxChunkBytes, storage.ErrConfig)
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{{"CallTimeout", &c.CallTimeout, DefaultCallTimeout}, {"DialTimeout", &c.DialTimeout, DefaultDialTimeout}, {"Backoff", &c.Backoff, DefaultBackoff}} {
		if *d.v == 0 {
			*d.v = d.def
		}
		if *d.v < 0 {
			return fmt.Errorf("redis store: %s of %v must not be negative: %w", d.name, *d.v, storage.ErrConfig)
		}
	}
	if c.TTL < 0 || (c.TTL > 0 && c.TTL < time.Millisecond) {
		return fmt.Errorf("redis store: TTL of %v: want 0 (no expiry) or at least 1 ms: %w", c.TTL, storage.ErrConfig)
	}
	if c.PoolSize < 0 {
		return fmt.Errorf("redis store: pool of %d connections: %w", c.PoolSize, storage.ErrConfig)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.now == nil {
		c.now = time.Now
	}
	return nil
}

// Bounds of ChunkBytes.
const (
	minChunkBytes = 1 << 10
	maxChunkBytes = 256 << 20
)

// ClientLogger adapts a slog.Logger to go-redis's process-wide logger (install it
// with redis.SetLogger in main), so that the client's own messages, such as a
// dial refused by a dead shard once per attempt, become Debug records of the
// program's log instead of raw lines on stderr. What an operator needs (a shard
// down, a shard back) the store logs itself through Config.Logger.
type ClientLogger struct {
	// Logger receives the messages; nil means slog.Default() at the time of each.
	Logger *slog.Logger
}

// Printf logs one go-redis message at Debug level.
func (l ClientLogger) Printf(ctx context.Context, format string, args ...any) {
	lg := l.Logger
	if lg == nil {
		lg = slog.Default()
	}
	if lg.Enabled(ctx, slog.LevelDebug) {
		lg.DebugContext(ctx, "redis client: "+fmt.Sprintf(format, args...))
	}
}
