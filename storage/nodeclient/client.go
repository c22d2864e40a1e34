// Package nodeclient is the storage backend of engines on a node: a client of the
// node service (`strata serve`, package node). Its allocator is shm, so every host
// pool of a group lives in a sealed memfd that the service can map; RegisterPool
// sends that memfd once, and every batch afterwards is one request that names
// bytes as (segment, offset, length) ranges: the service copies them with one
// memcpy, no page data on the socket. When the service restarts, the backend
// reconnects with backoff and registers its pools again (it keeps a duplicate of
// each memfd for that); meanwhile calls fail fast with storage.ErrUnavailable,
// which the cache turns into misses, and Epoch tells the cache when the client is
// back.
//
// Segment ids belong to a connection: the service numbers a client's segments
// per connection, and after a reconnect the pools may come back under each
// other's ids. So every request is built for one connection, from the ids
// registered on it, and is sent on that connection only; a request whose
// connection died before it was sent is rebuilt for the new one, never sent on
// it.
package nodeclient

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/storage"
)

// Config places a client.
type Config struct {
	// Socket is the node service's socket.
	Socket string `json:"socket"`
	// ClientName labels the client in the service's stats and logs (the engine's
	// name and rank, say).
	ClientName string `json:"clientName"`
	// CallTimeout bounds a call that has no earlier deadline.
	CallTimeout time.Duration `json:"callTimeout"`
	// ReconnectMin and ReconnectMax bound the backoff between connection attempts.
	// ReconnectMax is also how long a restarted service may wait for the client to
	// come back: dialing a socket nobody listens on costs microseconds, so keep it
	// well under a second.
	ReconnectMin time.Duration `json:"reconnectMin"`
	ReconnectMax time.Duration `json:"reconnectMax"`
	// Logger receives connection events; nil means slog.Default().
	Logger *slog.Logger `json:"-"`
}

// DefaultConfig returns a client of the service at socket: 5 s calls, reconnects
// every 50 ms doubling to 400 ms, so that a restarted service has its clients
// back, pools registered, well within a second.
func DefaultConfig(socket string) Config {
	return Config{Socket: socket, ClientName: fmt.Sprintf("engine-%d", os.Getpid()), CallTimeout: 5 * time.Second,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 400 * time.Millisecond}
}

// Backend is a storage.Backend over the node service.
type Backend struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	conn    *wire.Conn           // nil while disconnected
	links   map[*wire.Conn]*link // deadlines and fence page of each live connection (fence.go)
	pending map[uint64]chan reply
	pools   map[string]*poolReg
	closed  bool
	// ready is true once conn is up with every pool registered on it; up is
	// closed exactly then, and replaced by a fresh channel when a ready
	// connection fails. Only the connector closes up, and only for the
	// connection that is still conn, so a connection that dies while its pools
	// are being registered never closes a channel twice.
	ready  bool
	up     chan struct{}
	nextID atomic.Uint64
	epoch  atomic.Uint64 // ready connections so far
	// content is the service's ContentID on the last connection (0 before
	// the first, or from a service that does not say), and contentEpoch
	// counts the reconnections that found it changed (ContentEpoch).
	content      atomic.Uint64
	contentEpoch atomic.Uint64
	// conns counts losses, reconnects, failed calls and outages (stats.go).
	conns connCounters

	life context.Context // canceled by Close: ends the connector's waits and handshakes
	end  context.CancelFunc
	wg   sync.WaitGroup

	hooks hooks
	// reqs holds *requestBuffers for batch requests to be built in.
	reqs sync.Pool
}

// hooks let tests act at points where a race would otherwise have to be won by
// chance. They are nil outside tests.
type hooks struct {
	// beforeSend runs after a batch request was built for a connection and
	// before it is sent.
	beforeSend func()
}

var (
	_ storage.Backend        = (*Backend)(nil)
	_ storage.Reconnector    = (*Backend)(nil)
	_ storage.ContentTracker = (*Backend)(nil)
)

// New starts a client. It connects in the background and keeps reconnecting, so
// an engine may start before the service: until it is up, calls fail fast with
// storage.ErrUnavailable.
func New(cfg Config) (*Backend, error) {
	if cfg.Socket == "" {
		return nil, fmt.Errorf("node client: no socket path: %w", storage.ErrConfig)
	}
	if cfg.CallTimeout <= 0 || cfg.ReconnectMin <= 0 || cfg.ReconnectMax < cfg.ReconnectMin {
		return nil, fmt.Errorf("node client: call timeout %v, reconnect %v..%v: want positive and max >= min: %w",
			cfg.CallTimeout, cfg.ReconnectMin, cfg.ReconnectMax, storage.ErrConfig)
	}
	b := &Backend{cfg: cfg, log: cfg.Logger, pending: map[uint64]chan reply{}, pools: map[string]*poolReg{},
		links: map[*wire.Conn]*link{}, up: make(chan struct{})}
	b.life, b.end = context.WithCancel(context.Background())
	if b.log == nil {
		b.log = slog.Default()
	}
	b.wg.Add(1)
	go b.connector()
	return b, nil
}

// Name is "node".
func (b *Backend) Name() string { return "node" }

// Allocator is shm: the service maps the pools' memfds.
func (b *Backend) Allocator() hostmem.Kind { return hostmem.Shm }

// WaitConnected waits until the client is connected (and its pools registered),
// or ctx ends.
func (b *Backend) WaitConnected(ctx context.Context) error {
	b.mu.Lock()
	up := b.up
	b.mu.Unlock()
	select {
	case <-up:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("node client: connect to %s: %w: %w", b.cfg.Socket, ctx.Err(), storage.ErrUnavailable)
	}
}

// Epoch counts the connections on which the client had every pool registered
// (storage.Reconnector): 1 once connected, one more after each reconnect. A
// cache that stopped using L3 after a fault uses it again as soon as Epoch moves.
func (b *Backend) Epoch() uint64 { return b.epoch.Load() }

// ContentEpoch counts the reconnections to a service whose contents were not
// the ones of the connection before (storage.ContentTracker): it restarted
// empty, so what the client stored there is gone but for what the service's
// spill kept. A warm restart (the service kept its arena) does not move it.
func (b *Backend) ContentEpoch() uint64 { return b.contentEpoch.Load() }

// noteContent records the ContentID of a new connection's service and reports
// whether it differs from the last connection's.
func (b *Backend) noteContent(id uint64) bool {
	if id == 0 {
		return false // a service that does not say
	}
	old := b.content.Swap(id)
	if old == 0 || old == id {
		return false
	}
	b.contentEpoch.Add(1)
	return true
}

// Close stops reconnecting, closes the connection and the memfd duplicates.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	conn := b.conn
	b.end()
	b.mu.Unlock()
	if conn != nil {
		_ = conn.Close()
	}
	b.wg.Wait()
	b.mu.Lock()
	pools := b.pools
	b.pools = map[string]*poolReg{}
	b.mu.Unlock()
	for _, p := range pools {
		p.users.Wait() // a RegisterPool still sending it fails fast: its connection is closed
		_ = unix.Close(p.fd)
	}
	return nil
}
