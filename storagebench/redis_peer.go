package storagebench

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/stratakv/strata/internal/redisproc"
)

// ErrRedisNotInstalled reports that redis-server is not in PATH.
var ErrRedisNotInstalled = redisproc.ErrNotInstalled

// redisTimeout bounds one socket read or write of the Redis client. A pipeline of
// 128 pages moves 512 MiB or more in one go; on a loaded machine that can take
// seconds, and a timeout in the middle would leave a batch half stored.
const redisTimeout = 5 * time.Minute

// redisBuffer is the client's read and write buffer. Values of megabytes bypass
// it (bufio reads and writes them straight to and from the socket); what it
// carries is the commands and reply headers between them.
const redisBuffer = 1 << 20

// RedisPeer is Redis driven with raw pipelines: every chunk a value under a name,
// stored with one pipeline of SETs per batch and read back with one pipeline of
// GETs whose replies go straight into the host pages (go-redis's GetToBuffer, the
// client's fastest read: no allocation, no copy after the socket's). On a Redis
// Cluster the client splits each pipeline by master and runs the parts at once.
//
// StartRedis starts a server of its own for it (the service an engine would use
// instead of the node service); NewRedisPeer drives a client it is given (the
// redis backend's own, to hold the store against the raw commands it is built
// on). Close removes what it stored.
type RedisPeer struct {
	client redis.UniversalClient
	server *redisproc.Server // started by StartRedis; nil for NewRedisPeer
	name   string
	prefix string        // of the names Write makes up
	ttl    time.Duration // of every SET; 0 for none

	mu      sync.Mutex
	names   []string // what Write stored, for Read
	next    int
	written []string // every key stored, to delete at Close on a borrowed client
	closed  bool
}

var _ NamedPeer = (*RedisPeer)(nil)

// StartRedis starts redis-server on 127.0.0.1 and a free port, with persistence
// off and no memory limit, working in dir, and waits until it answers PING. It
// returns an error wrapping ErrRedisNotInstalled when there is no redis-server in
// PATH. Close stops the server.
func StartRedis(ctx context.Context, dir string) (*RedisPeer, error) {
	srv, err := redisproc.Start(dir, "--maxmemory", "0")
	if err != nil {
		return nil, err
	}
	client := redis.NewClient(&redis.Options{
		Addr:                     srv.Addr(),
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		DialTimeout:              5 * time.Second,
		ReadTimeout:              redisTimeout,
		WriteTimeout:             redisTimeout,
		MaxRetries:               -1, // a retried pipeline would be timed twice; fail instead
		PoolSize:                 2,
		ReadBufferSize:           redisBuffer,
		WriteBufferSize:          redisBuffer,
		PipelineReadBufferSize:   redisBuffer,
		PipelineWriteBufferSize:  redisBuffer,
	})
	p := &RedisPeer{client: client, server: srv, prefix: "strata-bench-chunk-"}
	version, err := redisVersion(ctx, client)
	if err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("redis-server on %s: %w", srv.Addr(), err)
	}
	p.name = fmt.Sprintf("redis-server %s on %s: pipelined SET, pipelined GET into the pages (go-redis v9, one pipeline per batch)", version, srv.Addr())
	return p, nil
}

// NewRedisPeer drives client, which it does not close: name describes it for the
// report, prefix starts the names Write makes up (distinct from any other user's
// keys), and ttl, when positive, expires every value it stores as a store with
// that TTL would. Close deletes every key it stored.
func NewRedisPeer(client redis.UniversalClient, name, prefix string, ttl time.Duration) *RedisPeer {
	return &RedisPeer{client: client, name: name, prefix: prefix, ttl: ttl}
}

// redisVersion reads redis_version from INFO server.
func redisVersion(ctx context.Context, c redis.UniversalClient) (string, error) {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("INFO: %w", err)
	}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "redis_version:"); ok {
			return v, nil
		}
	}
	return "?", nil
}

// Addr is the server's address for a peer StartRedis started, else "".
func (p *RedisPeer) Addr() string {
	if p.server == nil {
		return ""
	}
	return p.server.Addr()
}

// Pid is the server's process id for a peer StartRedis started, else 0.
func (p *RedisPeer) Pid() int {
	if p.server == nil {
		return 0
	}
	return p.server.PID()
}

// Name describes the server and how it is driven.
func (p *RedisPeer) Name() string { return p.name }

// Write stores src's chunks under names of the peer's own, in order.
func (p *RedisPeer) Write(ctx context.Context, src [][]byte) (time.Duration, error) {
	p.mu.Lock()
	names := make([]string, len(src))
	for i := range names {
		names[i] = fmt.Sprintf("%s%08d", p.prefix, len(p.names)+i)
	}
	p.names = append(p.names, names...)
	p.mu.Unlock()
	return p.WriteNamed(ctx, names, src)
}

// Read reads the next len(dst) chunks Write stored (see the Peer interface).
func (p *RedisPeer) Read(ctx context.Context, dst [][]byte) (time.Duration, error) {
	p.mu.Lock()
	if p.next+len(dst) > len(p.names) {
		p.mu.Unlock()
		return 0, fmt.Errorf("redis peer read: %d chunks asked, %d written and not read yet", len(dst), len(p.names)-p.next)
	}
	names := p.names[p.next : p.next+len(dst)]
	p.next += len(dst)
	p.mu.Unlock()
	return p.ReadNamed(ctx, names, dst)
}

// WriteNamed stores src[i] under names[i] with one pipeline of SETs.
func (p *RedisPeer) WriteNamed(ctx context.Context, names []string, src [][]byte) (time.Duration, error) {
	if len(names) != len(src) {
		return 0, fmt.Errorf("redis peer write: %d names for %d chunks", len(names), len(src))
	}
	p.mu.Lock()
	if p.server == nil {
		p.written = append(p.written, names...)
	}
	p.mu.Unlock()
	start := time.Now()
	pipe := p.client.Pipeline()
	for i, b := range src {
		pipe.Set(ctx, names[i], b, p.ttl)
	}
	cmds, err := pipe.Exec(ctx)
	d := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("redis peer: pipelined SET of %d values: %w", len(src), firstCmdError(cmds, err))
	}
	return d, nil
}

// ReadNamed reads names[i] into dst[i] with one pipeline of GETs.
func (p *RedisPeer) ReadNamed(ctx context.Context, names []string, dst [][]byte) (time.Duration, error) {
	if len(names) != len(dst) {
		return 0, fmt.Errorf("redis peer read: %d names for %d buffers", len(names), len(dst))
	}
	start := time.Now()
	pipe := p.client.Pipeline()
	gets := make([]*redis.ZeroCopyStringCmd, len(dst))
	for i, b := range dst {
		gets[i] = pipe.GetToBuffer(ctx, names[i], b)
	}
	cmds, err := pipe.Exec(ctx)
	d := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("redis peer: pipelined GET of %d values: %w", len(dst), firstCmdError(cmds, err))
	}
	for i, g := range gets {
		if n := g.Val(); n != len(dst[i]) {
			return 0, fmt.Errorf("redis peer: GET %s returned %d bytes, want %d", names[i], n, len(dst[i]))
		}
	}
	return d, nil
}

// firstCmdError names the first command of a pipeline that failed.
func firstCmdError(cmds []redis.Cmder, err error) error {
	for _, c := range cmds {
		if cerr := c.Err(); cerr != nil {
			args := c.Args()
			if len(args) > 1 {
				return fmt.Errorf("%v %v: %w", args[0], args[1], cerr)
			}
			return cerr
		}
	}
	return err
}

// forget deletes the values stored under names.
func (p *RedisPeer) forget(ctx context.Context, names []string) error {
	return p.del(ctx, names)
}

// del deletes keys, redisDeleteBatch to a pipeline, one key per DEL: a cluster's
// keys live in many slots.
func (p *RedisPeer) del(ctx context.Context, keys []string) error {
	for len(keys) > 0 {
		n := min(len(keys), redisDeleteBatch)
		pipe := p.client.Pipeline()
		for _, k := range keys[:n] {
			pipe.Del(ctx, k)
		}
		if cmds, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("redis peer: delete what it stored: %w", firstCmdError(cmds, err))
		}
		keys = keys[n:]
	}
	return nil
}

// redisDeleteBatch is the most keys one cleanup pipeline deletes.
const redisDeleteBatch = 512

// Close removes what the peer stored: it stops the server StartRedis started
// (nothing is persisted), or deletes every key it stored through a borrowed
// client. It may be called more than once.
func (p *RedisPeer) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.server != nil {
		_ = p.client.Close()
		p.server.Stop()
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := p.del(ctx, p.written)
	p.written = nil
	return err
}
