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
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/pagekey"
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

// poolReg is a registered pool: its spec, a duplicate of its memfd for
// re-registration, and its registration on a connection.
type poolReg struct {
	spec  storage.PoolSpec
	names pagekey.Names
	// tails are the parts' name suffixes when the parts' names differ in those
	// only (partTails), else nil.
	tails  [][]byte
	format uint64
	size   uint64 // the memfd's size, read once: the region may be closed while the dup lives
	fd     int
	// conn is the connection the pool is registered (or being registered) on;
	// segment, its id there (0 until the service answered), is meaningless on
	// any other connection. refused is the service's refusal on conn.
	conn    *wire.Conn
	segment uint32
	refused error
	// users counts registrations sending fd now, so that a RegisterPool that
	// replaces the pool, or Close, closes fd only after them: closed early, its
	// number could be reused and another file sent to the service.
	users sync.WaitGroup
}

// errStale reports a request built for a connection that is no longer the
// client's: its segment ids may name other pools on the current one.
var errStale = fmt.Errorf("node client: the connection the request was built for is gone: %w", storage.ErrUnavailable)

type reply struct {
	msg wire.Message
	err error
	// lost: the connection ended before the reply came.
	lost bool
}

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

// connector connects, registers the pools, waits for the connection to fail, and
// starts over with backoff until Close.
func (b *Backend) connector() {
	defer b.wg.Done()
	backoff := b.cfg.ReconnectMin
	for {
		dead, err := b.connect()
		if err == nil {
			backoff = b.cfg.ReconnectMin
			<-dead // the connection failed (or Close closed it)
		} else if !errors.Is(err, storage.ErrClosed) {
			b.log.Debug("node client: cannot reach the node service", "socket", b.cfg.Socket, "err", err)
		}
		select {
		case <-b.life.Done():
			return
		case <-time.After(backoff):
		}
		backoff = nextBackoff(backoff, b.cfg)
	}
}

// nextBackoff is the wait after one more failed attempt: doubling, at most
// ReconnectMax.
func nextBackoff(cur time.Duration, cfg Config) time.Duration {
	return min(2*cur, cfg.ReconnectMax)
}

// connect dials, says Hello, registers every pool, publishes the connection and
// starts its reader; the returned channel closes when the connection fails. The
// client is ready (up closed, Epoch one more) when every pool has been
// registered on the connection and it is still alive.
func (b *Backend) connect() (chan struct{}, error) {
	ctx, cancel := context.WithTimeout(b.life, b.cfg.CallTimeout)
	defer cancel()
	conn, err := wire.Dial(ctx, b.cfg.Socket)
	if err != nil {
		return nil, err
	}
	var l *link
	fail := func(err error) (chan struct{}, error) {
		_ = conn.Close()
		if l != nil {
			l.gone(false)
		}
		return nil, err
	}
	m, err := roundTrip(ctx, conn, wire.TypeHello, wire.Hello{Version: wire.Version, ClientName: b.cfg.ClientName, PID: int32(os.Getpid())})
	if err != nil {
		return fail(err)
	}
	hello, ok := m.(*wire.HelloReply)
	if !ok {
		return fail(fmt.Errorf("node service answered %T to Hello: %w", m, storage.ErrIO))
	}
	l = newLink(ctx, conn, hello, clockNow(), b.log, b.cfg.Socket)
	// Before the connection is published (and Epoch moves): a cache that sees
	// the new epoch sees the new content epoch too.
	emptied := b.noteContent(hello.ContentID)
	// Claim every pool for this connection before registering it, so that a
	// RegisterPool meanwhile is either in this list or sees the connection.
	b.mu.Lock()
	regs := make([]*poolReg, 0, len(b.pools))
	for _, p := range b.pools {
		p.conn, p.segment, p.refused = conn, 0, nil
		p.users.Add(1)
		regs = append(regs, p)
	}
	b.mu.Unlock()
	for i, p := range regs {
		seg, err := registerOn(ctx, conn, p)
		p.users.Done()
		if err != nil && !errors.Is(err, storage.ErrRegistration) {
			for _, q := range regs[i+1:] {
				q.users.Done()
			}
			return fail(err)
		}
		b.mu.Lock()
		if p.conn == conn {
			p.segment, p.refused = seg, err
		}
		b.mu.Unlock()
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return fail(storage.ErrClosed)
	}
	b.conn = conn
	b.links[conn] = l
	dead := make(chan struct{})
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		b.readLoop(conn)
		close(dead)
	}()
	// Pools registered while the connection was being set up missed the loop above.
	var missed []*poolReg
	for _, p := range b.pools {
		if p.conn != conn {
			p.conn, p.segment, p.refused = conn, 0, nil
			p.users.Add(1)
			missed = append(missed, p)
		}
	}
	b.mu.Unlock()
	for i, p := range missed {
		err := b.registerLive(ctx, p, conn)
		p.users.Done()
		if err != nil && !errors.Is(err, storage.ErrRegistration) {
			for _, q := range missed[i+1:] {
				q.users.Done()
			}
			// The connection died, or the service did not answer: a pool without
			// a segment on a live connection would never be used, so start over.
			b.log.Warn("node client: registering a pool after connecting failed; reconnecting", "pool", p.spec.Name, "err", err)
			_ = conn.Close()
			return dead, nil
		}
	}
	b.mu.Lock()
	ready := b.conn == conn && !b.ready
	var epoch uint64
	if ready {
		b.ready = true
		epoch = b.epoch.Add(1)
		close(b.up)
	}
	b.mu.Unlock()
	if emptied {
		b.log.Warn("node client: the node service came back empty (it restarted without its arena's contents); what this engine stored there is gone but for what its spill kept, and the cache stores again what it still holds",
			"socket", b.cfg.Socket)
	}
	if epoch > 1 {
		b.log.Info("node client: reconnected to the node service and registered its pools again", "socket", b.cfg.Socket, "pools", len(regs)+len(missed), "warm", hello.Warm)
	}
	return dead, nil
}

// roundTrip sends one request on a connection no reader goroutine serves yet and
// reads its reply.
func roundTrip(ctx context.Context, conn *wire.Conn, t wire.Type, msg wire.Message, fds ...int) (wire.Message, error) {
	if err := conn.Send(ctx, t, 1, msg, fds...); err != nil {
		return nil, err
	}
	_, m, rfds, err := conn.Recv(ctx)
	for _, fd := range rfds {
		_ = unix.Close(fd)
	}
	if err != nil {
		return nil, err
	}
	if e, ok := m.(*wire.Error); ok {
		return nil, e.Err()
	}
	return m, nil
}

func registerOn(ctx context.Context, conn *wire.Conn, p *poolReg) (uint32, error) {
	m, err := roundTrip(ctx, conn, wire.TypeRegisterSegment, wire.RegisterSegment{Size: p.size, Name: p.spec.Name}, p.fd)
	if err != nil {
		if st := wire.StatusOf(err); st == wire.Quota || st == wire.BadRange {
			return 0, fmt.Errorf("node service refused pool %q: %w: %w", p.spec.Name, err, storage.ErrRegistration)
		}
		return 0, err
	}
	r, ok := m.(*wire.RegisterSegmentReply)
	if !ok {
		return 0, fmt.Errorf("node service answered %T to RegisterSegment: %w", m, storage.ErrIO)
	}
	return r.SegmentID, nil
}

// readLoop dispatches replies until the connection fails, then fails every call
// waiting on it.
func (b *Backend) readLoop(conn *wire.Conn) {
	for {
		h, m, fds, err := conn.Recv(context.Background())
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
		if err != nil {
			var me *wire.MessageError
			if errors.As(err, &me) {
				b.deliver(me.Header.ID, reply{err: fmt.Errorf("node service reply: %w: %w", err, storage.ErrIO)})
				continue
			}
			b.mu.Lock()
			if b.conn == conn {
				b.conn = nil
				if b.ready {
					b.ready = false
					b.up = make(chan struct{})
				}
			}
			l := b.links[conn]
			delete(b.links, conn)
			waiting := b.pending
			b.pending = map[uint64]chan reply{}
			closed := b.closed
			b.mu.Unlock()
			switch {
			case closedByPeer(err) || closed || l == nil:
				_ = conn.Close()
				if l != nil {
					l.gone(closedByPeer(err))
				}
			default:
				// The client gives up on a connection the service still holds (a
				// reply it could not read): the service may still copy for the
				// calls on it. Shut only this side and learn when the service
				// closes it, which it does once those calls ended (fence.go).
				_ = conn.CloseWrite()
				b.wg.Add(1)
				go func() {
					defer b.wg.Done()
					peer := conn.AwaitClose(b.life)
					_ = conn.Close()
					l.gone(peer)
				}()
			}
			for _, ch := range waiting {
				ch <- reply{err: fmt.Errorf("node service connection lost: %w", storage.ErrUnavailable), lost: true}
			}
			if !closed {
				b.log.Warn("node client: lost the node service; reconnecting", "socket", b.cfg.Socket, "err", err)
			}
			return
		}
		var rep reply
		if e, ok := m.(*wire.Error); ok {
			rep.err = statusError(e.Code, e.Message)
		} else {
			rep.msg = m
		}
		b.deliver(h.ID, rep)
	}
}

func (b *Backend) deliver(id uint64, r reply) {
	b.mu.Lock()
	ch := b.pending[id]
	delete(b.pending, id)
	b.mu.Unlock()
	if ch != nil {
		ch <- r
	}
}

// call sends a request on the live connection and waits for its reply.
func (b *Backend) call(ctx context.Context, t wire.Type, msg wire.Message, fds ...int) (wire.Message, error) {
	return b.callOn(ctx, nil, t, msg, fds...)
}

// callOn sends a request on conn and waits for its reply; conn nil means the live
// connection. A request for a connection that is no longer the client's is not
// sent: it fails with errStale.
func (b *Backend) callOn(ctx context.Context, conn *wire.Conn, t wire.Type, msg wire.Message, fds ...int) (wire.Message, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.cfg.CallTimeout)
		defer cancel()
	}
	if err := ctx.Err(); err != nil {
		return nil, ctxErr(err)
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, fmt.Errorf("node client: %w", storage.ErrClosed)
	}
	switch {
	case b.conn == nil:
		b.mu.Unlock()
		return nil, fmt.Errorf("node client: not connected to %s (reconnecting): %w", b.cfg.Socket, storage.ErrUnavailable)
	case conn == nil:
		conn = b.conn
	case conn != b.conn:
		b.mu.Unlock()
		return nil, errStale
	}
	// Registered under the lock that checked conn: if conn fails from now on,
	// its reader fails this call too.
	id := b.nextID.Add(1)
	ch := make(chan reply, 1)
	b.pending[id] = ch
	l := b.links[conn]
	if l != nil {
		l.calls.Add(1)
		defer l.calls.Done()
	}
	b.mu.Unlock()
	// A Put or Get carries the deadline, and a Get a fence slot; a call that
	// ends without its reply waits until the service copies nothing for it
	// (fence.go).
	msg, slot, err := l.stamp(ctx, msg)
	if err != nil {
		b.mu.Lock()
		delete(b.pending, id)
		b.mu.Unlock()
		return nil, err
	}
	dl, _ := ctx.Deadline()
	gaveUp := func() {
		if t == wire.TypePut || t == wire.TypeGet {
			l.settle(slot, dl, b.life.Done(), b.log, b.cfg.Socket)
		}
		l.release(slot)
	}
	if err := conn.Send(ctx, t, id, msg, fds...); err != nil {
		b.mu.Lock()
		delete(b.pending, id)
		b.mu.Unlock()
		gaveUp()
		if ctx.Err() != nil {
			return nil, ctxErr(ctx.Err())
		}
		if errors.Is(err, wire.ErrMalformed) {
			return nil, fmt.Errorf("node client: %w: %w", err, storage.ErrBatch)
		}
		return nil, fmt.Errorf("node client: send: %w: %w", err, storage.ErrUnavailable)
	}
	select {
	case r := <-ch:
		if r.lost {
			gaveUp()
		} else {
			l.release(slot)
		}
		return r.msg, r.err
	case <-ctx.Done():
		b.mu.Lock()
		delete(b.pending, id)
		b.mu.Unlock()
		gaveUp()
		return nil, ctxErr(ctx.Err())
	}
}

func ctxErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("node client: %w: %w", err, storage.ErrTimeout)
	}
	return fmt.Errorf("node client: %w", err)
}

// statusError maps a service status to the storage error kinds.
func statusError(st wire.Status, msg string) error {
	var kind error
	switch st {
	case wire.OK:
		return nil
	case wire.NotFound, wire.FormatMismatch:
		kind = storage.ErrNotFound
	case wire.Corrupt:
		kind = storage.ErrCorrupt
	case wire.NoSpace:
		kind = storage.ErrNoSpace
	case wire.BadRange:
		kind = storage.ErrNotRegistered
	case wire.Quota:
		kind = storage.ErrRegistration
	case wire.Busy, wire.Unavailable:
		kind = storage.ErrUnavailable
	default:
		kind = storage.ErrIO
	}
	if msg == "" {
		return fmt.Errorf("node service: %v: %w", st, kind)
	}
	return fmt.Errorf("node service: %v: %s: %w", st, msg, kind)
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
