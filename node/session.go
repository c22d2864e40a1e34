package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/node/wire"
)

// maxInflight bounds the requests of one client handled at once.
const maxInflight = 8

// recv reads the client's next frame. Before Hello the whole Hello must arrive
// within HelloTimeout; after it, with an IdleTimeout, a client with no request in
// flight must send something within it; and a frame that started must end within
// FrameTimeout (the Conn's frame timeout). Otherwise a client that connects and
// says nothing, or sends part of a frame, would hold its slot for ever.
func (c *session) recv(helloBy time.Time) (wire.Header, wire.Message, []int, error) {
	cfg := &c.srv.cfg
	for {
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		switch {
		case !c.hello.Load():
			// From the connection's start, not per frame: a client that sends
			// other frames first does not get more time.
			ctx, cancel = context.WithDeadline(ctx, helloBy)
		case cfg.IdleTimeout > 0:
			ctx, cancel = context.WithTimeout(ctx, cfg.IdleTimeout)
		}
		h, msg, fds, err := c.conn.Recv(ctx)
		cancel()
		// Waiting on its own requests is not idle. (If a frame timed out instead,
		// the connection is unusable and the next Recv says so.)
		if err != nil && c.hello.Load() && errors.Is(err, context.DeadlineExceeded) && c.inflight.Load() > 0 {
			continue
		}
		return h, msg, fds, err
	}
}

// session is one client's connection: its identity, its segments, its counters.
type session struct {
	srv  *Server
	conn *wire.Conn
	id   uint64

	hello    atomic.Bool
	name     string
	pid      int
	uid      int
	uidKnown bool // the kernel told uid (SO_PEERCRED)
	// fence is the connection's fence page (window.go), nil until registered.
	fence      atomic.Pointer[fence]
	mu         sync.Mutex
	segments   map[uint32]*segment
	nextSeg    uint32
	registered int64
	// ns is the namespace of the client's objects (tenant.go): a prefix of every
	// key it names, set from its uid before the first request.
	ns      string
	refused []string
	// refusedOmitted counts refusals beyond the first maxRefused kept.
	refusedOmitted int64
	// inflight counts the client's batch requests being handled.
	inflight atomic.Int64
	// held is the request memory the gate took for the frame being received;
	// the read loop hands it to the request's handler or gives it back.
	held int64
	// inline is what the read loop reuses from one Get it serves itself
	// (getInArena) to the next: nothing else touches it.
	inline getScratch

	ops, objects, bytesIn, bytesOut atomic.Int64
}

func (c *session) serve() {
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxInflight)
	defer func() {
		// Every request ends before the connection closes: a client that sees
		// it closed knows the service copies nothing more for it (window.go).
		wg.Wait()
		_ = c.conn.Close()
		if f := c.fence.Load(); f != nil {
			f.release()
		}
		c.mu.Lock()
		segs := c.segments
		c.segments = map[uint32]*segment{}
		c.mu.Unlock()
		for _, s := range segs {
			c.srv.registeredBytes.Add(-int64(len(s.mem)))
			s.release()
		}
		c.srv.log.Info("client gone", "client", c.id, "name", c.name, "pid", c.pid)
	}()
	pid, uid, _, err := c.conn.PeerCred()
	if err == nil {
		c.pid, c.uid, c.uidKnown = pid, uid, true
	}
	c.ns = c.srv.tenants.namespace(uid, err == nil, c.id)
	c.conn.SetFrameTimeout(c.srv.cfg.FrameTimeout)
	c.conn.SetGate(c.admitFrame)
	helloBy := time.Now().Add(c.srv.cfg.HelloTimeout)
	for {
		h, msg, fds, err := c.recv(helloBy)
		cost := c.held
		c.held = 0
		if err != nil {
			c.srv.mem.release(c.uid, cost)
			var me *wire.MessageError
			if errors.As(err, &me) && errors.Is(me.Err, errMemoryBusy) {
				c.srv.st.memoryBusy.Add(1)
				c.reply(me.Header.ID, wire.TypeError, wire.Error{Code: wire.Busy, Message: wire.ClipMessage(me.Err.Error())})
				continue
			}
			if errors.As(err, &me) && errors.Is(me.Err, errHelloFirst) {
				c.reply(me.Header.ID, wire.TypeError, wire.Error{Code: wire.Internal, Message: "send Hello first"})
				continue
			}
			if errors.As(err, &me) && errors.Is(me.Err, errFrameTooLarge) {
				c.srv.st.malformed.Add(1)
				c.reply(me.Header.ID, wire.TypeError, wire.Error{Code: wire.Internal, Message: wire.ClipMessage("malformed request: " + me.Err.Error())})
				if !c.hello.Load() {
					return
				}
				continue
			}
			if errors.As(err, &me) {
				c.srv.st.malformed.Add(1)
				c.reply(me.Header.ID, wire.TypeError, wire.Error{Code: wire.Internal, Message: wire.ClipMessage("malformed request: " + me.Err.Error())})
				continue
			}
			switch {
			case errors.Is(err, context.DeadlineExceeded):
				c.srv.st.timedOut.Add(1)
				c.srv.logs.info("client disconnected: no Hello, an unfinished frame or idle past its timeout (--hello-timeout, --frame-timeout, --idle-timeout)",
					"client", c.id, "name", c.name, "pid", c.pid, "uid", c.uid, "err", err)
			case !errors.Is(err, io.EOF) && !errors.Is(err, wire.ErrClosed):
				c.srv.st.malformed.Add(1)
				c.srv.logs.warn("client connection broken", "client", c.id, "name", c.name, "err", err)
			}
			return
		}
		switch msg.(type) {
		case *wire.Exists, *wire.Put, *wire.Get, *wire.Remove:
		default:
			c.srv.mem.release(c.uid, cost) // nothing, unless a bug gated another type
			cost = 0
		}
		if _, ok := msg.(*wire.Hello); !ok && !c.hello.Load() {
			c.srv.mem.release(c.uid, cost)
			closeFDs(fds)
			c.reply(h.ID, wire.TypeError, wire.Error{Code: wire.Internal, Message: "send Hello first"})
			continue
		}
		c.scope(msg)
		switch m := msg.(type) {
		case *wire.Hello:
			if !c.handleHello(h.ID, m) {
				return
			}
		case *wire.RegisterSegment:
			c.handleRegister(h.ID, m, fds)
		case *wire.UnregisterSegment:
			c.handleUnregister(h.ID, m)
		case *wire.Ping:
			c.reply(h.ID, wire.TypePong, wire.Pong{Nonce: m.Nonce})
		case *wire.Stats:
			doc := c.srv.statsFor(c).document(c.srv.statsLimit)
			c.reply(h.ID, wire.TypeStatsReply, wire.StatsReply{JSON: doc})
		case *wire.Exists, *wire.Put, *wire.Get, *wire.Remove:
			if e, ok := m.(*wire.Exists); ok && c.existsInArena(h.ID, e) {
				c.srv.mem.release(c.uid, cost)
				continue
			}
			if g, ok := m.(*wire.Get); ok && c.getInArena(h.ID, g) {
				c.srv.mem.release(c.uid, cost)
				continue
			}
			sem <- struct{}{}
			wg.Add(1)
			c.inflight.Add(1)
			go func() {
				defer func() { c.inflight.Add(-1); c.srv.mem.release(c.uid, cost); <-sem; wg.Done() }()
				if hk := c.srv.cfg.hooks; hk != nil && hk.admitted != nil {
					hk.admitted(h.Type)
				}
				c.handleBatch(h.ID, m)
			}()
		default:
			closeFDs(fds)
			c.reply(h.ID, wire.TypeError, wire.Error{Code: wire.Internal, Message: fmt.Sprintf("unexpected %v from a client", h.Type)})
		}
	}
}

// maxHelloBody is the longest Hello body the service reads: a Hello is a
// version, a name of at most wire.MaxName bytes and a pid, some 300 bytes.
// maxControlBody is the longest body of the other frames that are not
// requests (RegisterSegment, UnregisterSegment, Ping, Stats), which take no
// more than a name either. Neither is charged to the request budget, so their
// reads are bounded instead: else every connection could make the service
// read a 16 MiB body into memory of its own.
const (
	maxHelloBody   = 4 << 10
	maxControlBody = 64 << 10
)

// overShareLine is logged, once a minute per user at most, when a user holds
// more than its share of the request memory while another wants some.
const overShareLine = "a user holds more than its share of the request memory; its requests wait while other users' go first " +
	"(if every user's load is legitimate, raise --request-memory)"

// admitFrame is the connection's gate (wire.Conn.SetGate). Before Hello it
// admits only a Hello of at most maxHelloBody and charges nothing: a
// connection that has not introduced itself may not hold request memory,
// since its frames would only be refused (the others' bodies are dropped
// without being kept). After it, before the body of a Put, Get, Exists or
// Remove is read, it takes the request's memory from the node's budget under
// the user's share (budget.go), waiting up to RequestTimeout while other
// requests hold it, and fails with errMemoryBusy past that (the client is
// answered busy). It waits on the connection's read goroutine, so the
// client's next frames wait in the socket rather than in the service's memory.
func (c *session) admitFrame(_ context.Context, h wire.Header) error {
	if !c.hello.Load() {
		switch {
		case h.Type != wire.TypeHello:
			return errHelloFirst
		case h.Len > maxHelloBody:
			return fmt.Errorf("a Hello of %d bytes; a Hello takes at most %d: %w", h.Len, maxHelloBody, errFrameTooLarge)
		}
		return nil
	}
	switch h.Type {
	case wire.TypeExists, wire.TypePut, wire.TypeGet, wire.TypeRemove:
	default:
		if h.Len > maxControlBody {
			return fmt.Errorf("a %v of %d bytes; the service reads at most %d of one that is not a Put, Get, Exists or Remove: %w",
				h.Type, h.Len, maxControlBody, errFrameTooLarge)
		}
		return nil
	}
	cost := requestCost(h)
	ctx, cancel := context.WithTimeout(context.Background(), c.srv.cfg.RequestTimeout)
	defer cancel()
	err := c.srv.mem.acquire(ctx, c.srv.done, c.uid, cost, c.srv.logOverShare)
	if err != nil {
		c.srv.logs.warn("request memory budget full; answered busy (raise --request-memory, or send smaller batches)",
			"client", c.id, "name", c.name, "uid", c.uid, "limit", c.srv.cfg.RequestMemoryBytes)
		return fmt.Errorf("the node service's request memory (%d bytes) had no room for this request within this user's share for %v: retry later; the operator can raise --request-memory: %w",
			c.srv.cfg.RequestMemoryBytes, c.srv.cfg.RequestTimeout, errMemoryBusy)
	}
	c.held = cost
	return nil
}

// logOverShare logs the line of a user over its share of the request memory.
func (s *Server) logOverShare(n overShare) {
	args := []any{"uid", n.uid, "held", n.held, "share", n.share, "users", n.users, "limit", s.cfg.RequestMemoryBytes}
	if n.suppressed > 0 {
		args = append(args, "suppressed", n.suppressed)
	}
	s.log.Warn(overShareLine, args...)
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

func (c *session) reply(id uint64, t wire.Type, msg wire.Message) {
	ctx, cancel := context.WithTimeout(context.Background(), c.srv.cfg.RequestTimeout)
	defer cancel()
	if err := c.conn.Send(ctx, t, id, msg); err != nil && !errors.Is(err, wire.ErrClosed) {
		c.srv.log.Debug("reply to a client failed", "client", c.id, "err", err)
	}
}
