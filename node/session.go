package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/node/arena"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/storage"
)

// maxInflight bounds the requests of one client handled at once.
const maxInflight = 8

// session is one client's connection: its identity, its segments, its counters.
type session struct {
	srv  *Server
	conn *wire.Conn
	id   uint64

	hello      atomic.Bool
	name       string
	pid        int
	uid        int
	mu         sync.Mutex
	segments   map[uint32]*segment
	nextSeg    uint32
	registered int64
	refused    []string

	ops, objects, bytesIn, bytesOut atomic.Int64
}

func (c *session) serve() {
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxInflight)
	defer func() {
		wg.Wait()
		_ = c.conn.Close()
		c.mu.Lock()
		segs := c.segments
		c.segments = map[uint32]*segment{}
		c.mu.Unlock()
		for _, s := range segs {
			s.release()
		}
		c.srv.log.Info("client gone", "client", c.id, "name", c.name, "pid", c.pid)
	}()
	if pid, uid, _, err := c.conn.PeerCred(); err == nil {
		c.pid, c.uid = pid, uid
	}
	ctx := context.Background()
	for {
		h, msg, fds, err := c.conn.Recv(ctx)
		if err != nil {
			var me *wire.MessageError
			if errors.As(err, &me) {
				c.srv.st.malformed.Add(1)
				c.reply(me.Header.ID, wire.TypeError, wire.Error{Code: wire.Internal, Message: wire.ClipMessage("malformed request: " + me.Err.Error())})
				continue
			}
			if !errors.Is(err, io.EOF) && !errors.Is(err, wire.ErrClosed) {
				c.srv.st.malformed.Add(1)
				c.srv.log.Warn("client connection broken", "client", c.id, "name", c.name, "err", err)
			}
			return
		}
		if _, ok := msg.(*wire.Hello); !ok && !c.hello.Load() {
			closeFDs(fds)
			c.reply(h.ID, wire.TypeError, wire.Error{Code: wire.Internal, Message: "send Hello first"})
			continue
		}
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
			doc, _ := json.Marshal(c.srv.Stats())
			c.reply(h.ID, wire.TypeStatsReply, wire.StatsReply{JSON: doc})
		case *wire.Exists, *wire.Put, *wire.Get, *wire.Remove:
			if e, ok := m.(*wire.Exists); ok && c.existsInArena(h.ID, e) {
				continue
			}
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				c.handleBatch(h.ID, m)
			}()
		default:
			closeFDs(fds)
			c.reply(h.ID, wire.TypeError, wire.Error{Code: wire.Internal, Message: fmt.Sprintf("unexpected %v from a client", h.Type)})
		}
	}
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
	c.reply(id, wire.TypeHelloReply, wire.HelloReply{ClientID: c.id, ServerVersion: serverVersion(), MaxBatch: MaxBatchObjects})
	return true
}

func (c *session) handleRegister(id uint64, m *wire.RegisterSegment, fds []int) {
	fd := fds[0]
	refuse := func(code wire.Status, why string) {
		_ = unix.Close(fd)
		c.mu.Lock()
		c.refused = append(c.refused, why)
		c.mu.Unlock()
		c.srv.st.refused.Add(1)
		c.srv.log.Warn("segment registration refused", "client", c.id, "name", c.name, "segment", m.Name, "reason", why)
		c.reply(id, wire.TypeError, wire.Error{Code: code, Message: wire.ClipMessage(why)})
	}
	c.mu.Lock()
	over := c.registered+int64(m.Size) > c.srv.cfg.ClientQuotaBytes
	have := c.registered
	c.mu.Unlock()
	if over {
		refuse(wire.Quota, fmt.Sprintf("segment %q of %d bytes would bring client %q to %d bytes of registered memory, over its quota of %d: raise the service's --client-quota or shrink the host pool; this pool runs without L3",
			m.Name, m.Size, c.name, have+int64(m.Size), c.srv.cfg.ClientQuotaBytes))
		return
	}
	mem, err := mapSegment(fd, m.Size)
	if err != nil {
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

func (c *session) handleUnregister(id uint64, m *wire.UnregisterSegment) {
	c.mu.Lock()
	seg := c.segments[m.SegmentID]
	if seg != nil {
		delete(c.segments, m.SegmentID)
		c.registered -= int64(len(seg.mem))
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
	ctx, cancel := context.WithTimeout(context.Background(), c.srv.cfg.RequestTimeout)
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
		n := 0
		for _, k := range m.Keys {
			removed := s.arena.Remove(k)
			if s.spill != nil {
				if had, err := s.spill.RemoveObject(ctx, k); err == nil && had {
					removed = true
				}
			}
			if s.remote != nil {
				if st := s.remote.store.Load(); st != nil {
					if had, err := st.RemoveObject(ctx, k); err == nil && had {
						removed = true
					}
				}
			}
			if removed {
				n++
			}
		}
		s.st.removes.Add(int64(n))
		c.reply(id, wire.TypeRemoveReply, wire.RemoveReply{Removed: uint32(n)})
	case *wire.Put:
		s.st.puts.Add(1)
		results := make([]wire.Result, len(m.Items))
		s.forEach(len(m.Items), func(i int) { results[i] = c.putItem(ctx, m.Items[i]) })
		c.reply(id, wire.TypeBatchReply, wire.BatchReply{Results: results})
	case *wire.Get:
		s.st.gets.Add(1)
		results := make([]wire.Result, len(m.Items))
		s.forEach(len(m.Items), func(i int) { results[i] = c.getItem(ctx, m.Items[i]) })
		if s.remote != nil {
			var missed []int
			for i, r := range results {
				if r.Status == wire.NotFound {
					missed = append(missed, i)
				}
			}
			c.fetchRemote(ctx, m.Items, missed, results)
		}
		// Counted once every tier had its say, so that the counter never goes
		// down when Redis serves what the local tiers missed.
		for _, r := range results {
			if r.Status == wire.NotFound {
				s.st.misses.Add(1)
			}
		}
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

// forEach runs fn for 0..n-1 on up to CopyWorkers goroutines.
func (s *Server) forEach(n int, fn func(i int)) {
	var next atomic.Int64
	work := func() {
		for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
			fn(i)
		}
	}
	var wg sync.WaitGroup
	for w := 1; w < min(s.cfg.CopyWorkers, n); w++ {
		wg.Go(work)
	}
	work()
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

func (c *session) putItem(ctx context.Context, it wire.Item) wire.Result {
	s := c.srv
	r, err := c.resolve(it)
	if err != nil {
		s.st.badRanges.Add(1)
		return wire.Result{Status: wire.BadRange, Message: wire.ClipMessage(c.badRange(it))}
	}
	defer r.done()
	p, res := c.reservePut(ctx, it, r.size)
	if p == nil {
		return res
	}
	defer p.Abort()
	s.hookReserved(it.Key)
	if err := copyFromRuns(p.Bytes(), r.runs); err != nil {
		return c.segmentFault(it, r, err)
	}
	if err := p.Commit(); err != nil {
		return wire.Result{Status: wire.Internal, Message: wire.ClipMessage(err.Error())}
	}
	if s.remote != nil {
		s.remote.enqueue(it.Key, it.Format, r.size)
	}
	s.st.putObjects.Add(1)
	s.st.putBytes.Add(r.size)
	c.objects.Add(1)
	c.bytesIn.Add(r.size)
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
			if _, err := s.spill.ObjectSize(ctx, it.Key, storage.Format(it.Format)); err == nil {
				s.st.putSkipped.Add(1)
				return nil, wire.Result{} // write-once: the spill has it
			}
		}
		p, err := s.arena.Reserve(it.Key, it.Format, size)
		switch {
		case err == nil:
			return p, wire.Result{}
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
func (c *session) getItem(ctx context.Context, it wire.Item) wire.Result {
	s := c.srv
	r, err := c.resolve(it)
	if err != nil {
		s.st.badRanges.Add(1)
		return wire.Result{Status: wire.BadRange, Message: wire.ClipMessage(c.badRange(it))}
	}
	defer r.done()
	// Each round that does not answer waited for a write of the key to end or
	// found another request promoting it, so a few rounds are plenty.
	for attempt := 0; attempt < 4; attempt++ {
		l, err := s.arena.Acquire(it.Key, it.Format)
		if err == nil {
			res := c.serveLease(l, it, r)
			if res.Status == wire.OK {
				s.st.arenaHits.Add(1)
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
		res, retry := c.promote(ctx, it, r)
		if !retry {
			return res
		}
	}
	return wire.Result{Status: wire.NotFound}
}

func (c *session) serveLease(l *arena.Lease, it wire.Item, r resolved) wire.Result {
	defer l.Release()
	b := l.Bytes()
	if int64(len(b)) != r.size {
		return wire.Result{Status: wire.BadRange, Message: wire.ClipMessage(fmt.Sprintf("object %s holds %d bytes, the ranges %d", it.Key, len(b), r.size))}
	}
	if err := copyToRuns(r.runs, b); err != nil {
		return c.segmentFault(it, r, err)
	}
	c.objects.Add(1)
	c.bytesOut.Add(r.size)
	c.srv.st.getBytes.Add(r.size)
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
		if err := copyToRuns(r.runs, buf); err != nil {
			return c.segmentFault(it, r, err), false
		}
	default:
		defer p.Abort()
		s.hookReserved(it.Key)
		if err := s.spill.GetObject(ctx, it.Key, format, p.Bytes()); err != nil {
			return spillResult(err, s), false
		}
		if err := copyToRuns(r.runs, p.Bytes()); err != nil {
			return c.segmentFault(it, r, err), false
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
