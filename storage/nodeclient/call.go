package nodeclient

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/storage"
)

// errStale reports a request built for a connection that is no longer the
// client's: its segment ids may name other pools on the current one.
var errStale = fmt.Errorf("node client: the connection the request was built for is gone: %w", storage.ErrUnavailable)

type reply struct {
	msg wire.Message
	err error
	// lost: the connection ended before the reply came.
	lost bool
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
					if !b.closed {
						b.lostLocked(time.Now())
					}
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
		b.conns.refused.Add(1)
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
		b.conns.lost.Add(1)
		return nil, fmt.Errorf("node client: send: %w: %w", err, storage.ErrUnavailable)
	}
	select {
	case r := <-ch:
		if r.lost {
			b.conns.lost.Add(1)
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
