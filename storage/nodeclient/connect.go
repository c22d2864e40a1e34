package nodeclient

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/storage"
)

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
		} else if !errors.Is(err, storage.ErrClosed) && b.life.Err() == nil {
			b.conns.dialFailures.Add(1)
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
	// The reader loop receives with no deadline (replies come when they come),
	// so a reply that starts and stalls would hold it, and every call on the
	// connection, until Close; a frame the service writes whole takes far less
	// than a call's time to arrive.
	conn.SetFrameTimeout(b.cfg.CallTimeout)
	var l *link
	fail := func(err error) (chan struct{}, error) {
		_ = conn.Close()
		if l != nil {
			l.gone(false)
		}
		return nil, err
	}
	m, err := roundTrip(ctx, conn, wire.TypeHello, wire.Hello{Version: wire.Version, ClientName: b.cfg.ClientName, PID: int32(os.Getpid()), Revision: wire.Revision})
	if err != nil {
		return fail(err)
	}
	hello, ok := m.(*wire.HelloReply)
	if !ok {
		return fail(fmt.Errorf("node service answered %T to Hello: %w", m, storage.ErrIO))
	}
	l = newLink(ctx, conn, hello, clockNow(), b.log, b.cfg.Socket)
	// Runs only where the service said it takes them: an older one answers
	// no revision (1), and gets ranges.
	l.runs = wire.RevisionOf(hello.Revision) >= 2
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
		b.backLocked(time.Now())
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
