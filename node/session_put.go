package node

import (
	"context"
	"errors"
	"fmt"

	"github.com/stratakv/strata/node/arena"
	"github.com/stratakv/strata/node/spill"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/storage"
)

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

// formatMismatch answers a put of key whose object is stored in another format:
// objects are write-once, so answering ok would store nothing and the client's
// next get would miss.
func formatMismatch(key string) wire.Result {
	return wire.Result{Status: wire.FormatMismatch, Message: wire.ClipMessage(fmt.Sprintf(
		"object %s is stored in another format (another layout, geometry or page size): objects are write-once; remove it first, or name objects of each format apart (the pool's model prefix)", key))}
}
