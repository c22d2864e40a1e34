package node

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/stratakv/strata/node/arena"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/storage"
)

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
