package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/stratakv/strata/storage"
)

// presence is what a check found under an object's name.
type presence uint8

const (
	unchecked presence = iota
	absent             // no header
	present            // a header in the format, and every chunk
	foreign            // a header of another format
	partial            // a header in the format, chunks missing
	damaged            // a header that is unreadable or names another object
)

// op is one object of a batch call, and what the call found out about it.
type op struct {
	name   string
	format storage.Format
	runs   [][]byte // the body's host memory: destination of a get, source of a put
	size   int64    // body length; 0 when unknown (ExistsObjects)
	plan   []int64  // this side's cut of the body; nil when unknown

	shard  *shard
	err    error
	done   bool // the op has its result (err, or success)
	retry  bool // read again in a second pass
	verify bool // read whole: its checksum is to be checked

	state   presence
	hdr     header
	hdrOK   bool   // hdr decoded
	hdrRaw  string // the header's bytes as the first pass read them
	delKeys int    // chunk keys to delete with the header (cleanup), when queued for it

	hdrCmd    *redis.StringCmd
	existsCmd *redis.IntCmd
	chunkCmds []*redis.ZeroCopyStringCmd
	spans     []chunkSpan
	staged    [][]byte // per chunk: its staging buffer, nil for a direct chunk
	writeCmds []redis.Cmder
}

// batch runs one call's objects through pipelines and keeps track of the shards
// they touched.
type batch struct {
	s      *Store
	what   string
	caller context.Context // the caller's context: its end is not a shard's fault
	ctx    context.Context // caller's, bounded by CallTimeout
	cancel context.CancelFunc
	ops    []*op
	down   map[*shard]error
	up     map[*shard]bool
	bufs   []*[]byte
	dels   []*op
}

// newBatch starts a call over ops (some may be done already: refused by a
// check) and routes them to their shards, failing fast the ones whose shard is
// down. The caller must call end.
func (s *Store) newBatch(ctx context.Context, what string, ops []*op) *batch {
	s.stats.calls.Add(1)
	s.stats.objects.Add(int64(len(ops)))
	b := &batch{s: s, what: what, caller: ctx, ops: ops, down: map[*shard]error{}, up: map[*shard]bool{}}
	b.ctx, b.cancel = s.callTimeout(ctx)
	if err := ctx.Err(); err != nil {
		for _, o := range b.live() {
			b.finish(o, ctxError(what+" "+o.name, err))
		}
		return b
	}
	now := s.shards.now()
	for _, o := range b.live() {
		sh, err := s.shardOf(b.ctx, o.name)
		if err != nil {
			b.fail(o, err)
			continue
		}
		o.shard = sh
		if err := sh.down(now); err != nil {
			s.stats.skippedShards.Add(1)
			b.finish(o, err)
		}
	}
	return b
}

// shardOf is the shard that holds object name.
func (s *Store) shardOf(ctx context.Context, name string) (*shard, error) {
	if s.cluster == nil {
		return s.single, nil
	}
	c, err := s.cluster.MasterForKey(ctx, headerKey(name))
	if err != nil {
		return nil, err
	}
	return s.shards.get(c.Options().Addr), nil
}

// end removes the objects found damaged, records which shards answered or
// failed, counts faults and releases the staging buffers.
func (b *batch) end() {
	b.cleanup()
	for sh, err := range b.down {
		b.s.shards.failed(sh, err)
	}
	for sh := range b.up {
		if b.down[sh] == nil {
			b.s.shards.answered(sh)
		}
	}
	for _, o := range b.ops {
		b.s.stats.fault(o.err)
	}
	for _, p := range b.bufs {
		b.s.bufs.Put(p)
	}
	b.bufs = nil
	b.cancel()
}

func (b *batch) live() []*op {
	var out []*op
	for _, o := range b.ops {
		if !o.done {
			out = append(out, o)
		}
	}
	return out
}

func (b *batch) finish(o *op, err error) {
	o.err, o.done = err, true
}

// answered notes that o's shard answered a command.
func (b *batch) answered(o *op) {
	if o.shard != nil {
		b.up[o.shard] = true
	}
}

// where names o's shard for messages.
func (o *op) where() string {
	if o.shard == nil {
		return ""
	}
	return " on " + o.shard.addr
}

// fail ends o with the store's error for err, an error of one of its commands,
// and notes whether the error says its shard is down.
func (b *batch) fail(o *op, err error) {
	kind, down := classify(b.caller, err)
	if o.shard != nil {
		switch {
		case down:
			if b.down[o.shard] == nil {
				b.down[o.shard] = err
			}
		case kind == storage.ErrNoSpace || kind == storage.ErrIO:
			b.up[o.shard] = true // it answered, with an error
		}
	}
	var e error
	switch kind {
	case nil:
		e = fmt.Errorf("redis store: %s %s%s: %w", b.what, o.name, o.where(), err)
	case storage.ErrNoSpace:
		e = fmt.Errorf("redis store: %s %s%s: %w; the server is full (maxmemory with a noeviction policy): give it an allkeys-lru policy or more memory: %w",
			b.what, o.name, o.where(), err, kind)
	default:
		e = fmt.Errorf("redis store: %s %s%s: %w: %w", b.what, o.name, o.where(), err, kind)
	}
	b.finish(o, e)
}

// miss ends o as not found.
func (b *batch) miss(o *op, why string) {
	b.s.stats.misses.Add(1)
	b.finish(o, fmt.Errorf("redis store: object %s%s: %s: %w", o.name, o.where(), why, storage.ErrNotFound))
}

// corrupt ends o as corrupt and queues its keys (the header and chunks chunk
// keys) for removal.
func (b *batch) corrupt(o *op, chunks int, why string) {
	b.s.stats.corrupt.Add(1)
	b.remove(o, chunks)
	b.finish(o, fmt.Errorf("redis store: object %s%s: %s; removed it: %w", o.name, o.where(), why, storage.ErrCorrupt))
}

// partialMiss ends o as a miss because chunks are missing, and queues the rest
// for removal so that the next put stores the object again.
func (b *batch) partialMiss(o *op, chunks int, why string) {
	b.s.stats.partial.Add(1)
	b.remove(o, chunks)
	b.miss(o, why+" (evicted or expired, or its writer died); removed the rest")
}

func (b *batch) remove(o *op, chunks int) {
	o.delKeys = max(chunks, len(o.plan))
	b.dels = append(b.dels, o)
}

// stage returns a staging buffer of n bytes, released when the batch ends.
func (b *batch) stage(n int64) []byte {
	p, _ := b.s.bufs.Get().(*[]byte)
	if p == nil || int64(cap(*p)) < n {
		buf := make([]byte, n)
		p = &buf
	}
	*p = (*p)[:n]
	b.bufs = append(b.bufs, p)
	return *p
}

// cleanup deletes the keys of the objects queued for removal, with one pipeline.
// It is best effort: a failure leaves keys that the next reader removes.
func (b *batch) cleanup() {
	if len(b.dels) == 0 || b.ctx.Err() != nil {
		return
	}
	pipe := b.s.rdb.Pipeline()
	for _, o := range b.dels {
		pipe.Del(b.ctx, objectKeys(o.name, o.delKeys)...)
	}
	_, _ = pipe.Exec(b.ctx)
	b.dels = nil
}

// objectKeys are the header key and the first chunks chunk keys of name.
func objectKeys(name string, chunks int) []string {
	keys := make([]string, 0, chunks+1)
	keys = append(keys, headerKey(name))
	for i := 0; i < chunks; i++ {
		keys = append(keys, chunkKey(name, i))
	}
	return keys
}

func chunkKeys(name string, from, to int) []string {
	keys := make([]string, 0, to-from)
	for i := from; i < to; i++ {
		keys = append(keys, chunkKey(name, i))
	}
	return keys
}
