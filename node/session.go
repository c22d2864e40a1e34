package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/node/arena"
	"github.com/stratakv/strata/node/spill"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/storage"
)

// maxInflight bounds the requests of one client handled at once.
const maxInflight = 8

// maxRefused is how many refusals a session keeps the reasons of, for Stats;
// beyond it they are only counted.
const maxRefused = 16

// noteRefusedLocked records why a registration was refused or a segment dropped;
// c.mu is held.
func (c *session) noteRefusedLocked(why string) {
	if len(c.refused) >= maxRefused {
		c.refusedOmitted++
		return
	}
	c.refused = append(c.refused, why)
}

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
			c.srv.mem.release(cost)
			var me *wire.MessageError
			if errors.As(err, &me) && errors.Is(me.Err, errMemoryBusy) {
				c.srv.st.memoryBusy.Add(1)
				c.reply(me.Header.ID, wire.TypeError, wire.Error{Code: wire.Busy, Message: wire.ClipMessage(me.Err.Error())})
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
			c.srv.mem.release(cost) // nothing, unless a bug gated another type
			cost = 0
		}
		if _, ok := msg.(*wire.Hello); !ok && !c.hello.Load() {
			c.srv.mem.release(cost)
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
				c.srv.mem.release(cost)
				continue
			}
			if g, ok := m.(*wire.Get); ok && c.getInArena(h.ID, g) {
				c.srv.mem.release(cost)
				continue
			}
			sem <- struct{}{}
			wg.Add(1)
			c.inflight.Add(1)
			go func() {
				defer func() { c.inflight.Add(-1); c.srv.mem.release(cost); <-sem; wg.Done() }()
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

// admitFrame is the connection's gate (wire.Conn.SetGate): before the body of
// a Put, Get, Exists or Remove is read, it takes the request's memory from the
// node's budget, waiting up to RequestTimeout while other requests hold it, and
// fails with errMemoryBusy past that (the client is answered busy). It waits on
// the connection's read goroutine, so the client's next frames wait in the
// socket rather than in the service's memory.
func (c *session) admitFrame(_ context.Context, h wire.Header) error {
	switch h.Type {
	case wire.TypeExists, wire.TypePut, wire.TypeGet, wire.TypeRemove:
	default:
		return nil
	}
	cost := requestCost(h)
	ctx, cancel := context.WithTimeout(context.Background(), c.srv.cfg.RequestTimeout)
	defer cancel()
	if err := c.srv.mem.acquire(ctx, c.srv.done, cost); err != nil {
		c.srv.logs.warn("request memory budget full; answered busy (raise --request-memory, or send smaller batches)",
			"client", c.id, "name", c.name, "limit", c.srv.cfg.RequestMemoryBytes)
		return fmt.Errorf("the node service's request memory (%d bytes) stayed full for %v: retry later; the operator can raise --request-memory: %w",
			c.srv.cfg.RequestMemoryBytes, c.srv.cfg.RequestTimeout, errMemoryBusy)
	}
	c.held = cost
	return nil
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

func (c *session) handleHello(id uint64, m *wire.Hello) bool {
	if m.Version != wire.Version {
		c.reply(id, wire.TypeError, wire.Error{Code: wire.Unavailable,
			Message: fmt.Sprintf("protocol version %d is not served; this service speaks version %d: upgrade the client or the service", m.Version, wire.Version)})
		return false
	}
	c.name = m.ClientName
	if m.PID > 0 && c.pid == 0 {
		c.pid = int(m.PID)
	}
	c.hello.Store(true)
	c.srv.log.Info("client connected", "client", c.id, "name", c.name, "pid", c.pid)
	st := c.srv.startStats(c.srv.arena.Stats())
	c.reply(id, wire.TypeHelloReply, wire.HelloReply{ClientID: c.id, ServerVersion: serverVersion(), MaxBatch: MaxBatchObjects, ClockNS: monoNow(),
		InstanceID: st.InstanceID, ContentID: st.ContentID, Starting: st.State != StateReady, ReadyPercent: uint32(st.ReadyPercent), Warm: st.Warm})
	return true
}

func (c *session) handleRegister(id uint64, m *wire.RegisterSegment, fds []int) {
	fd := fds[0]
	if m.Fence {
		c.handleFence(id, m, fd)
		return
	}
	refuse := func(code wire.Status, why string) {
		_ = unix.Close(fd)
		c.mu.Lock()
		c.noteRefusedLocked(why)
		c.mu.Unlock()
		c.srv.st.refused.Add(1)
		c.srv.logs.warn("segment registration refused", "client", c.id, "name", c.name, "segment", m.Name, "reason", why)
		c.reply(id, wire.TypeError, wire.Error{Code: code, Message: wire.ClipMessage(why)})
	}
	c.mu.Lock()
	over := c.registered+int64(m.Size) > c.srv.cfg.ClientQuotaBytes
	have, segs := c.registered, len(c.segments)
	c.mu.Unlock()
	if segs >= c.srv.cfg.MaxSegmentsPerClient {
		// Each segment holds a descriptor and a mapping in the service: without
		// a bound, thousands of tiny segments run the service out of descriptors.
		refuse(wire.Quota, fmt.Sprintf("segment %q would be client %q's segment number %d, over the service's --max-segments-per-client of %d: "+
			"register fewer, larger host pools; this pool runs without L3", m.Name, c.name, segs+1, c.srv.cfg.MaxSegmentsPerClient))
		return
	}
	if over {
		refuse(wire.Quota, fmt.Sprintf("segment %q of %d bytes would bring client %q to %d bytes of registered memory, over its quota of %d: raise the service's --client-quota or shrink the host pool; this pool runs without L3",
			m.Name, m.Size, c.name, have+int64(m.Size), c.srv.cfg.ClientQuotaBytes))
		return
	}
	if why := c.srv.chargeRegistered(m.Name, int64(m.Size)); why != "" {
		refuse(wire.Quota, why)
		return
	}
	mem, err := mapSegment(fd, m.Size)
	if err != nil {
		c.srv.registeredBytes.Add(-int64(m.Size))
		refuse(wire.BadRange, fmt.Sprintf("segment %q: %v", m.Name, err))
		return
	}
	c.mu.Lock()
	c.nextSeg++
	seg := &segment{id: c.nextSeg, name: m.Name, fd: fd, mem: mem}
	c.segments[seg.id] = seg
	c.registered += int64(m.Size)
	c.mu.Unlock()
	c.reply(id, wire.TypeRegisterSegmentReply, wire.RegisterSegmentReply{SegmentID: seg.id})
}

// handleFence registers the connection's fence page (window.go). It is not a
// host pool: it counts against no quota (it is one page), and ranges never
// name it.
func (c *session) handleFence(id uint64, m *wire.RegisterSegment, fd int) {
	refuse := func(why string) {
		_ = unix.Close(fd)
		c.srv.logs.warn("fence page refused", "client", c.id, "name", c.name, "reason", why)
		c.reply(id, wire.TypeError, wire.Error{Code: wire.BadRange, Message: wire.ClipMessage(why)})
	}
	if c.fence.Load() != nil {
		refuse("this connection has a fence page already; one per connection")
		return
	}
	f, err := mapFence(fd, m.Size)
	if err != nil {
		refuse(fmt.Sprintf("fence page %q: %v", m.Name, err))
		return
	}
	c.fence.Store(f)
	c.mu.Lock()
	c.nextSeg++
	sid := c.nextSeg
	c.mu.Unlock()
	c.reply(id, wire.TypeRegisterSegmentReply, wire.RegisterSegmentReply{SegmentID: sid})
}

func (c *session) handleUnregister(id uint64, m *wire.UnregisterSegment) {
	c.mu.Lock()
	seg := c.segments[m.SegmentID]
	if seg != nil {
		delete(c.segments, m.SegmentID)
		c.registered -= int64(len(seg.mem))
		c.srv.registeredBytes.Add(-int64(len(seg.mem)))
	}
	c.mu.Unlock()
	if seg == nil {
		c.reply(id, wire.TypeError, wire.Error{Code: wire.BadRange, Message: fmt.Sprintf("segment %d is not registered by this client", m.SegmentID)})
		return
	}
	seg.release()
	c.reply(id, wire.TypeAck, nil)
}

func (c *session) handleBatch(id uint64, msg wire.Message) {
	ctx, cancel := context.WithTimeout(c.srv.life, c.srv.cfg.RequestTimeout)
	defer cancel()
	c.ops.Add(1)
	s := c.srv
	switch m := msg.(type) {
	case *wire.Exists:
		s.st.exists.Add(1)
		n := s.arena.ContainsPrefix(m.Keys, m.Format)
		for _, k := range m.Keys[n:] {
			if !s.has(ctx, k, m.Format) {
				break
			}
			n++
		}
		if s.remote != nil && n < len(m.Keys) {
			n += s.remote.exists(ctx, m.Keys[n:], m.Format)
		}
		c.reply(id, wire.TypeExistsReply, wire.ExistsReply{Present: uint32(n)})
	case *wire.Remove:
		n, err := s.remove(ctx, m.Keys)
		s.st.removes.Add(int64(n))
		if err != nil {
			code := wire.Internal
			if errors.Is(err, errStarting) {
				code = wire.Busy
			}
			c.reply(id, wire.TypeError, wire.Error{Code: code, Message: wire.ClipMessage(c.unscopeText(err.Error()))})
			return
		}
		c.reply(id, wire.TypeRemoveReply, wire.RemoveReply{Removed: uint32(n)})
	case *wire.Put:
		s.st.puts.Add(1)
		w := c.newWindow(m.DeadlineNS, m.FenceSlot)
		ctx, cancel := w.context(ctx)
		defer cancel()
		results := make([]wire.Result, len(m.Items))
		c.eachItem(m.Items, w, func(i int, r resolved, t *tally) { results[i] = c.putResolved(ctx, m.Items[i], r, t) },
			func(i int) { results[i] = c.refuseRange(m.Items[i]) }, c.flushPuts)
		c.unscope(results)
		c.reply(id, wire.TypeBatchReply, wire.BatchReply{Results: results})
	case *wire.Get:
		s.st.gets.Add(1)
		w := c.newWindow(m.DeadlineNS, m.FenceSlot)
		ctx, cancel := w.context(ctx)
		defer cancel()
		results := make([]wire.Result, len(m.Items))
		if !c.getSmall(ctx, m.Items, w, results) {
			c.eachItem(m.Items, w, func(i int, r resolved, t *tally) { results[i] = c.getResolved(ctx, m.Items[i], r, t) },
				func(i int) { results[i] = c.refuseRange(m.Items[i]) }, c.flushGets)
		}
		if s.remote != nil {
			var missed []int
			for i, r := range results {
				if r.Status == wire.NotFound {
					missed = append(missed, i)
				}
			}
			// Promoted objects' keys may be kept: copies of their own, not
			// slices of the request's shared key buffer.
			for _, i := range missed {
				m.Items[i].Key = strings.Clone(m.Items[i].Key)
			}
			c.fetchRemote(ctx, m.Items, w, missed, results)
		}
		// Counted once every tier had its say, so that the counter never goes
		// down when Redis serves what the local tiers missed.
		for _, r := range results {
			if r.Status == wire.NotFound {
				s.st.misses.Add(1)
			}
		}
		c.unscope(results)
		c.reply(id, wire.TypeBatchReply, wire.BatchReply{Results: results})
	}
}

// existsInArena answers an Exists on the connection's own goroutine when the
// arena alone decides it: it holds every key, or there is no spill or Redis to
// look in after it. That is a few microseconds of map lookups under one lock,
// and it saves the goroutine, the timer and the scheduling of handleBatch,
// which were most of a lookup's round trip on a busy machine (a prefetch asks
// before every request it schedules). It reports whether it answered.
func (c *session) existsInArena(id uint64, m *wire.Exists) bool {
	s := c.srv
	n := s.arena.ContainsPrefix(m.Keys, m.Format)
	if n < len(m.Keys) && (s.spill != nil || s.remote != nil) {
		return false
	}
	c.ops.Add(1)
	s.st.exists.Add(1)
	c.reply(id, wire.TypeExistsReply, wire.ExistsReply{Present: uint32(n)})
	return true
}

// getScratch holds a small Get's keys, leases and results (arena.AcquireInto):
// one of each per batch instead of a Lease allocated per object.
type getScratch struct {
	keys    []string
	leases  []arena.Lease
	errs    []error
	results []wire.Result
}

// lease leases the objects of items under one lock into sc, and reports false,
// leasing nothing, when it cannot: items of several formats (which a client
// never sends, but may), or the arena closed.
func (c *session) lease(items []wire.Item, sc *getScratch) bool {
	format := items[0].Format
	sc.keys = sc.keys[:0]
	for i := range items {
		if items[i].Format != format {
			clear(sc.keys)
			sc.keys = sc.keys[:0]
			return false
		}
		sc.keys = append(sc.keys, items[i].Key)
	}
	n := len(items)
	if cap(sc.leases) < n {
		sc.leases, sc.errs = make([]arena.Lease, n), make([]error, n)
	}
	sc.leases, sc.errs = sc.leases[:n], sc.errs[:n]
	return c.srv.arena.AcquireInto(sc.keys, format, sc.leases, sc.errs) == nil
}

// done releases sc's leases and drops its references to the request (its keys
// are slices of the request's buffer).
func (sc *getScratch) done(a *arena.Arena) {
	a.ReleaseAll(sc.leases)
	clear(sc.keys)
	sc.keys = sc.keys[:0]
}

// smallBatch reports whether items name less than inlineBatchBytes in all.
func smallBatch(items []wire.Item) bool {
	var n uint64
	for i := range items {
		for _, r := range items[i].Ranges {
			if n += r.Length; n >= inlineBatchBytes || r.Length >= inlineBatchBytes {
				return false
			}
		}
	}
	return len(items) > 0
}

// copyHits fills results with the items that sc leased (copied into their
// ranges) and those with a range outside the client's segments, counting in t,
// and reports whether any item is left: one the arena did not hold.
func (c *session) copyHits(items []wire.Item, b *batchRanges, sc *getScratch, results []wire.Result, t *tally) (left bool) {
	for i := range items {
		r, ok := b.item(i)
		switch {
		case !ok:
			results[i] = c.refuseRange(items[i])
		case sc.errs[i] == nil:
			if results[i] = c.copyLease(&sc.leases[i], items[i], r); results[i].Status == wire.OK {
				t.hits++
				t.objects++
				t.bytes += r.size
			}
		default:
			left = true
		}
	}
	return left
}

// getSmall serves a Get under inlineBatchBytes on the request's goroutine: the
// objects the arena holds from leases taken under one lock, the others one by
// one (getResolved: waits for writes, the spill), once the leases are released.
// It reports false, doing nothing, for a larger batch or one it cannot lease at
// once; eachItem serves those.
func (c *session) getSmall(ctx context.Context, items []wire.Item, w *window, results []wire.Result) bool {
	var sc getScratch
	if !smallBatch(items) || !c.lease(items, &sc) {
		return false
	}
	b := c.resolveBatch(items, w)
	defer b.done()
	var t [1]tally
	left := c.copyHits(items, b, &sc, results, &t[0])
	sc.done(c.srv.arena)
	if left {
		for i := range items {
			if r, ok := b.item(i); ok && sc.errs[i] != nil {
				results[i] = c.getResolved(ctx, items[i], r, &t[0])
			}
		}
	}
	c.flushGets(t[:])
	return true
}

// getInArena answers a Get on the connection's own goroutine when nothing in it
// can block: it is under inlineBatchBytes and the arena holds every object (a
// miss may wait for a write, read the spill or ask Redis). That saves the
// goroutine, the timer and the wake-ups of handleBatch, and reuses the
// session's scratch (c.inline) for the leases and results. It reports whether
// it answered; when not, it leased nothing and the Get goes to handleBatch.
func (c *session) getInArena(id uint64, m *wire.Get) bool {
	s := c.srv
	if hk := s.cfg.hooks; hk != nil && hk.admitted != nil {
		return false // a test holds requests admitted: let it
	}
	sc := &c.inline
	if !smallBatch(m.Items) || !c.lease(m.Items, sc) {
		return false
	}
	for _, err := range sc.errs {
		if err != nil {
			sc.done(s.arena)
			return false
		}
	}
	n := len(m.Items)
	if cap(sc.results) < n {
		sc.results = make([]wire.Result, n)
	}
	results := sc.results[:n]
	clear(results)
	b := c.resolveBatch(m.Items, c.newWindow(m.DeadlineNS, m.FenceSlot))
	var t [1]tally
	c.copyHits(m.Items, b, sc, results, &t[0])
	sc.done(s.arena)
	b.done()
	c.ops.Add(1)
	s.st.gets.Add(1)
	c.flushGets(t[:])
	c.unscope(results)
	// Send encodes the reply before it returns: results can be reused after.
	c.reply(id, wire.TypeBatchReply, wire.BatchReply{Results: results})
	clear(results)
	return true
}

// inlineBatchBytes is the size under which a batch's items are served on the
// request's own goroutine rather than fanned out to CopyWorkers. Below it the
// copies are a small part of the work, and two workers serving tiny items
// mostly take turns at the arena's lock: a Get of 256 objects of 1 KiB took the
// same time either way on a 2-core machine (within the noise of
// BenchmarkNodeSmallObjects), so it runs on one core and leaves the other to
// the engine. Above it the copies dominate and spread over the workers.
const inlineBatchBytes = 1 << 20

// tally counts what a worker served, added to the shared counters once per
// batch rather than with four atomic adds per object. Padded to a cache line so
// that workers do not share one.
type tally struct {
	objects, bytes, hits int64
	_                    [40]byte
}

// eachItem serves the items of a Put or Get: it resolves their ranges at once
// (resolveBatch), calls serve for each item that resolved and refuse for each
// that did not, on the request's goroutine for a small batch and on up to
// CopyWorkers goroutines otherwise, and hands the workers' tallies to flush.
func (c *session) eachItem(items []wire.Item, w *window, serve func(i int, r resolved, t *tally), refuse func(i int), flush func([]tally)) {
	b := c.resolveBatch(items, w)
	defer b.done()
	workers := 1
	if b.bytes >= inlineBatchBytes {
		workers = max(1, min(c.srv.cfg.CopyWorkers, len(items)))
	}
	tallies := make([]tally, workers)
	c.srv.forEach(len(items), workers, func(w, i int) {
		if r, ok := b.item(i); ok {
			serve(i, r, &tallies[w])
		} else {
			refuse(i)
		}
	})
	flush(tallies)
}

// flushPuts adds the workers' tallies of a Put to the counters.
func (c *session) flushPuts(ts []tally) {
	var t tally
	for i := range ts {
		t.objects, t.bytes = t.objects+ts[i].objects, t.bytes+ts[i].bytes
	}
	if t.objects > 0 {
		c.srv.st.putObjects.Add(t.objects)
		c.srv.st.putBytes.Add(t.bytes)
		c.objects.Add(t.objects)
		c.bytesIn.Add(t.bytes)
	}
}

// flushGets adds the workers' tallies of a Get to the counters.
func (c *session) flushGets(ts []tally) {
	var t tally
	for i := range ts {
		t.objects, t.bytes, t.hits = t.objects+ts[i].objects, t.bytes+ts[i].bytes, t.hits+ts[i].hits
	}
	if t.objects > 0 {
		c.srv.st.arenaHits.Add(t.hits)
		c.objects.Add(t.objects)
		c.bytesOut.Add(t.bytes)
		c.srv.st.getBytes.Add(t.bytes)
	}
}

// forEach runs fn(w, i) for i in 0..n-1 on workers goroutines (the caller's
// among them), w naming the one that runs it (0 to workers-1).
func (s *Server) forEach(n, workers int, fn func(w, i int)) {
	if workers <= 1 || n <= 1 {
		for i := range n {
			fn(0, i)
		}
		return
	}
	var next atomic.Int64
	work := func(w int) {
		for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
			fn(w, i)
		}
	}
	var wg sync.WaitGroup
	for w := 1; w < min(workers, n); w++ {
		wg.Go(func() { work(w) })
	}
	work(0)
	wg.Wait()
}

// has reports whether key exists in format in the arena or the spill directory.
func (s *Server) has(ctx context.Context, key string, format uint64) bool {
	if s.arena.Contains(key, format) {
		return true
	}
	if s.spill == nil {
		return false
	}
	_, err := s.spill.ObjectSize(ctx, key, storage.Format(format))
	return err == nil
}

// refuseRange answers an item with a range outside the client's segments.
func (c *session) refuseRange(it wire.Item) wire.Result {
	c.srv.st.badRanges.Add(1)
	return wire.Result{Status: wire.BadRange, Message: wire.ClipMessage(c.badRange(it))}
}

// putResolved stores item it from its resolved ranges r, counting it in t.
func (c *session) putResolved(ctx context.Context, it wire.Item, r resolved, t *tally) wire.Result {
	s := c.srv
	if !r.win.open() {
		return c.copyFailed(it, r, errDeadline)
	}
	p, res := c.reservePut(ctx, it, r.size)
	if p == nil {
		return res
	}
	defer p.Abort()
	s.hookReserved(it.Key)
	if err := r.win.copyIn(p.Bytes(), r.runs); err != nil {
		return c.copyFailed(it, r, err)
	}
	if err := p.Commit(); errors.Is(err, arena.ErrRemoved) {
		// A remove of the key landed while it was written: the put ends as if
		// it had come first and been removed (node/arena's remove.go).
		t.objects++
		t.bytes += r.size
		return wire.Result{}
	} else if err != nil {
		return wire.Result{Status: wire.Internal, Message: wire.ClipMessage(err.Error())}
	}
	if s.remote != nil {
		s.remote.enqueue(it.Key, it.Format, r.size)
	}
	t.objects++
	t.bytes += r.size
	return wire.Result{}
}

// reservePut reserves the arena extent a put of it writes, or answers the put
// without one (p nil). A put answers OK only when the object is readable: stored
// already (write-once), or written by another request that this one waited for.
// Answering OK while another request's write of the key is still pending would
// let the client's next Get miss the object it was told is stored; if that write
// is aborted, this put writes the object itself.
func (c *session) reservePut(ctx context.Context, it wire.Item, size int64) (*arena.Pending, wire.Result) {
	s := c.srv
	for {
		if s.spill != nil {
			_, err := s.spill.ObjectSize(ctx, it.Key, storage.Format(it.Format))
			if err == nil {
				s.st.putSkipped.Add(1)
				return nil, wire.Result{} // write-once: the spill has it
			}
			if errors.Is(err, spill.ErrOtherFormat) {
				return nil, formatMismatch(it.Key)
			}
		}
		p, err := s.arena.Reserve(it.Key, it.Format, size)
		switch {
		case err == nil:
			return p, wire.Result{}
		case errors.Is(err, arena.ErrFormat):
			return nil, formatMismatch(it.Key)
		case errors.Is(err, arena.ErrExists):
			s.hookAwaiting(it.Key)
			waited, err := s.arena.Await(ctx, it.Key)
			if err != nil {
				s.st.busy.Add(1)
				return nil, wire.Result{Status: wire.Busy, Message: wire.ClipMessage(fmt.Sprintf(
					"object %s is still being written by another request: it is not stored yet; put it again later", it.Key))}
			}
			if !waited {
				s.st.putSkipped.Add(1)
				return nil, wire.Result{} // committed: write-once
			}
			// The other write ended: committed (the next Reserve says so) or aborted
			// (the next Reserve is ours).
		case errors.Is(err, arena.ErrNoSpace):
			s.st.noSpace.Add(1)
			return nil, wire.Result{Status: wire.NoSpace, Message: "the arena is full of objects being read or written; retry later or give the service a larger --arena"}
		default:
			return nil, wire.Result{Status: wire.Internal, Message: wire.ClipMessage(err.Error())}
		}
	}
}

// getItem reads it from the arena or the spill. A miss is not counted here: a
// Get counts the items that every tier, Redis included, missed.
func (c *session) getItem(ctx context.Context, it wire.Item, w *window) wire.Result {
	r, err := c.resolve(it, w)
	if err != nil {
		return c.refuseRange(it)
	}
	defer r.done()
	t := make([]tally, 1)
	res := c.getResolved(ctx, it, r, &t[0])
	c.flushGets(t)
	return res
}

// getResolved reads it into its resolved ranges r from the arena or the spill,
// counting what the arena served in t.
func (c *session) getResolved(ctx context.Context, it wire.Item, r resolved, t *tally) wire.Result {
	s := c.srv
	// Each round that does not answer waited for a write of the key to end or
	// found another request promoting it, so a few rounds are plenty.
	for attempt := 0; attempt < 4; attempt++ {
		l, err := s.arena.Acquire(it.Key, it.Format)
		if err == nil {
			res := c.serveLease(l, it, r)
			if res.Status == wire.OK {
				t.hits++
				t.objects++
				t.bytes += r.size
			}
			return res
		}
		if errors.Is(err, arena.ErrFormat) {
			return wire.Result{Status: wire.NotFound, Message: "stored in another format (another layout, geometry or page size)"}
		}
		// Being written: a put, or another get promoting it from the spill or
		// Redis. Wait for it rather than call an object that is there a miss.
		s.hookAwaiting(it.Key)
		waited, err := s.arena.Await(ctx, it.Key)
		if err != nil {
			return wire.Result{Status: wire.NotFound, Message: "still being written when the request timed out"}
		}
		if waited {
			continue
		}
		if s.spill == nil {
			break
		}
		// A Get's keys share one buffer (wire decodes them so); the arena may
		// keep the key of an object it promotes, so it gets its own copy.
		it.Key = strings.Clone(it.Key)
		res, retry := c.promote(ctx, it, r)
		if !retry {
			return res
		}
	}
	return wire.Result{Status: wire.NotFound}
}

func (c *session) serveLease(l *arena.Lease, it wire.Item, r resolved) wire.Result {
	defer l.Release()
	return c.copyLease(l, it, r)
}

// copyLease copies the object l leases into its item's resolved ranges r.
func (c *session) copyLease(l *arena.Lease, it wire.Item, r resolved) wire.Result {
	b := l.Bytes()
	if int64(len(b)) != r.size {
		return wire.Result{Status: wire.BadRange, Message: wire.ClipMessage(fmt.Sprintf("object %s holds %d bytes, the ranges %d", it.Key, len(b), r.size))}
	}
	if err := r.win.copyOut(r.runs, b); err != nil {
		return c.copyFailed(it, r, err)
	}
	return wire.Result{}
}

// promote serves a get from the spill directory, bringing the object back into the
// arena when it has room (and straight into the client's ranges when it has none).
// retry asks the caller to look in the arena again: another client promoted it.
func (c *session) promote(ctx context.Context, it wire.Item, r resolved) (res wire.Result, retry bool) {
	s := c.srv
	format := storage.Format(it.Format)
	size, err := s.spill.ObjectSize(ctx, it.Key, format)
	if err != nil {
		return spillResult(err, s), false
	}
	if size != r.size {
		return wire.Result{Status: wire.BadRange, Message: wire.ClipMessage(fmt.Sprintf("object %s holds %d bytes, the ranges %d", it.Key, size, r.size))}, false
	}
	p, err := s.arena.Reserve(it.Key, it.Format, size)
	switch {
	case errors.Is(err, arena.ErrExists):
		return wire.Result{}, true
	case err != nil:
		// No room to promote: serve it from the SSD through a buffer of the
		// service's own (see bounce), not straight into the client's memory.
		buf := bounce(size)
		if err := s.spill.GetObject(ctx, it.Key, format, buf); err != nil {
			return spillResult(err, s), false
		}
		if err := r.win.copyOut(r.runs, buf); err != nil {
			return c.copyFailed(it, r, err), false
		}
	default:
		defer p.Abort()
		s.hookReserved(it.Key)
		if err := s.spill.GetObject(ctx, it.Key, format, p.Bytes()); err != nil {
			return spillResult(err, s), false
		}
		if err := r.win.copyOut(r.runs, p.Bytes()); err != nil {
			return c.copyFailed(it, r, err), false
		}
		if h := s.cfg.hooks; h != nil && h.promoting != nil {
			h.promoting(it.Key)
		}
		if p.Commit() == nil {
			s.st.promotions.Add(1)
		}
	}
	s.st.spillHits.Add(1)
	c.objects.Add(1)
	c.bytesOut.Add(r.size)
	s.st.getBytes.Add(r.size)
	return wire.Result{}, false
}

func spillResult(err error, s *Server) wire.Result {
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return wire.Result{Status: wire.NotFound}
	case errors.Is(err, storage.ErrCorrupt):
		s.st.corrupt.Add(1)
		return wire.Result{Status: wire.Corrupt, Message: wire.ClipMessage(err.Error())}
	}
	return wire.Result{Status: wire.Internal, Message: wire.ClipMessage(err.Error())}
}

// formatMismatch answers a put of key whose object is stored in another format:
// objects are write-once, so answering ok would store nothing and the client's
// next get would miss.
func formatMismatch(key string) wire.Result {
	return wire.Result{Status: wire.FormatMismatch, Message: wire.ClipMessage(fmt.Sprintf(
		"object %s is stored in another format (another layout, geometry or page size): objects are write-once; remove it first, or name objects of each format apart (the pool's model prefix)", key))}
}
