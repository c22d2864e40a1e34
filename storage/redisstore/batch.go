package redisstore

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"github.com/zeebo/xxh3"

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

// get reads every live op's object into its runs and verifies it.
func (b *batch) get() {
	live := b.live()
	if len(live) == 0 {
		return
	}
	b.readPass(live, false)
	var again []*op
	for _, o := range live {
		if o.retry {
			o.retry = false
			again = append(again, o)
		}
	}
	if len(again) == 0 || b.ctx.Err() != nil {
		for _, o := range again {
			b.fail(o, b.ctx.Err())
		}
		return
	}
	b.readPass(again, true)
}

// readPass reads ops with one pipeline: each header and each chunk of the op's
// plan, the chunks straight into host memory (or a staging buffer for a chunk
// that crosses runs). second is the pass that follows up on the first.
//
// A chunk is read with GETRANGE key 0 n-1 rather than GET: a value longer than
// its buffer would make go-redis fail that command and, without reading their
// replies, every later one on the connection. GETRANGE never returns more than
// the buffer holds; the bytes past it are not part of the body the header
// describes, and the checksum still covers every byte that is served. A missing
// key reads as 0 bytes (a chunk is never empty).
func (b *batch) readPass(ops []*op, second bool) {
	pipe := b.s.rdb.Pipeline()
	for _, o := range ops {
		o.hdrCmd = pipe.GetRange(b.ctx, headerKey(o.name), 0, maxHeaderBytes-1)
		o.spans = mapPlan(o.runs, o.plan)
		o.staged = nil
		o.chunkCmds = o.chunkCmds[:0]
		for i, sp := range o.spans {
			buf := sp.direct
			if buf == nil {
				buf = b.stage(sp.n)
				if o.staged == nil {
					o.staged = make([][]byte, len(o.spans))
				}
				o.staged[i] = buf
			}
			cmd := redis.NewZeroCopyStringCmd(b.ctx, buf, "getrange", chunkKey(o.name, i), 0, sp.n-1)
			_ = pipe.Process(b.ctx, cmd)
			o.chunkCmds = append(o.chunkCmds, cmd)
		}
	}
	_, _ = pipe.Exec(b.ctx)
	for _, o := range ops {
		b.finishRead(o, second)
	}
	b.verify(ops)
}

// finishRead judges what a read pass brought for o.
func (b *batch) finishRead(o *op, second bool) {
	raw, err := o.hdrCmd.Result()
	if err != nil {
		b.fail(o, err)
		return
	}
	b.answered(o)
	if raw == "" {
		b.miss(o, "no such object")
		return
	}
	if second && o.hdrRaw != "" && raw != o.hdrRaw {
		b.miss(o, "rewritten while it was read")
		return
	}
	h, derr := decodeHeader([]byte(raw))
	if derr != nil {
		b.corrupt(o, len(o.plan), "header: "+derr.Error())
		return
	}
	o.hdr, o.hdrOK, o.hdrRaw = h, true, raw
	switch {
	case h.format != o.format:
		b.miss(o, "stored in another format (another layout, geometry or page size)")
		return
	case h.nameSum != xxh3.HashString(o.name):
		b.corrupt(o, len(h.plan), "its header belongs to another object")
		return
	case h.bodyLen != o.size:
		b.finish(o, fmt.Errorf("redis store: object %s%s holds %d bytes, %d were asked for: %w", o.name, o.where(), h.bodyLen, o.size, storage.ErrBatch))
		return
	case !samePlan(h.plan, o.plan):
		if second {
			b.corrupt(o, len(h.plan), "its cut changed between two reads")
			return
		}
		// Written with another cut: read again the writer's way.
		b.s.stats.replans.Add(1)
		o.plan, o.retry = h.plan, true
		return
	}
	var fault error
	short, shortLen, missing := -1, 0, -1
	for i, c := range o.chunkCmds {
		n, err := c.Result()
		switch {
		case err == nil && int64(n) == o.spans[i].n:
		case err == nil && n == 0:
			if missing < 0 {
				missing = i
			}
		case err == nil:
			if short < 0 {
				short, shortLen = i, n
			}
		case fault == nil:
			fault = err
		}
	}
	switch {
	case fault != nil:
		b.fail(o, fault)
		return
	case short >= 0:
		b.corrupt(o, len(h.plan), fmt.Sprintf("chunk %d holds %d bytes, want %d", short, shortLen, o.spans[short].n))
		return
	case missing >= 0:
		b.partialMiss(o, len(h.plan), fmt.Sprintf("chunk %d of %d is missing", missing, len(h.plan)))
		return
	}
	for i, sp := range o.spans {
		if sp.direct == nil {
			buf := o.staged[i]
			for _, p := range sp.pieces {
				buf = buf[copy(p, buf):]
			}
			b.s.stats.staged.Add(1)
		}
	}
	o.verify = true
}

// verifyParallel is the body bytes from which a read pass verifies its objects
// on several goroutines: the checksum is bound by memory bandwidth (~10 GB/s for
// one core over a batch that is not in cache), and the server is idle by then.
const verifyParallel = 8 << 20

// verify checks the checksum of every op that finishRead left to verify, over
// the bytes in host memory, and ends each as read or corrupt.
func (b *batch) verify(ops []*op) {
	var todo []*op
	var bytes int64
	for _, o := range ops {
		if o.verify {
			todo = append(todo, o)
			bytes += o.size
		}
	}
	ok := make([]bool, len(todo))
	workers := min(runtime.GOMAXPROCS(0), len(todo), 8)
	if bytes < verifyParallel {
		workers = 1
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(todo) {
					return
				}
				ok[i] = sumRuns(todo[i].runs) == todo[i].hdr.bodySum
			}
		})
	}
	wg.Wait()
	for i, o := range todo {
		o.verify = false
		if !ok[i] {
			b.corrupt(o, len(o.hdr.plan), "body checksum mismatch")
			continue
		}
		b.s.stats.reads.Add(1)
		b.s.stats.readBytes.Add(o.size)
		b.finish(o, nil)
	}
}

// check finds out what is stored under each live op's name: one pipeline of
// header reads and (where the op knows its cut) EXISTS of the chunks, and a second
// one of EXISTS for the ops whose header has another cut.
func (b *batch) check() {
	ops := b.live()
	if len(ops) == 0 {
		return
	}
	pipe := b.s.rdb.Pipeline()
	for _, o := range ops {
		o.hdrCmd = pipe.GetRange(b.ctx, headerKey(o.name), 0, maxHeaderBytes-1)
		if o.plan != nil {
			o.existsCmd = pipe.Exists(b.ctx, chunkKeys(o.name, 0, len(o.plan))...)
		}
	}
	_, _ = pipe.Exec(b.ctx)
	var again []*op
	for _, o := range ops {
		raw, err := o.hdrCmd.Result()
		if err != nil {
			b.fail(o, err)
			continue
		}
		b.answered(o)
		if raw == "" {
			o.state = absent
			continue
		}
		h, derr := decodeHeader([]byte(raw))
		switch {
		case derr != nil:
			o.state = damaged
			continue
		case h.format != o.format:
			o.state = foreign
			continue
		case h.nameSum != xxh3.HashString(o.name):
			o.state = damaged
			continue
		}
		o.hdr, o.hdrOK = h, true
		if o.plan == nil || !samePlan(h.plan, o.plan) {
			again = append(again, o)
			continue
		}
		n, err := o.existsCmd.Result()
		if err != nil {
			b.fail(o, err)
			continue
		}
		o.state = present
		if n != int64(len(o.plan)) {
			o.state = partial
		}
	}
	if len(again) == 0 {
		return
	}
	pipe = b.s.rdb.Pipeline()
	for _, o := range again {
		o.existsCmd = pipe.Exists(b.ctx, chunkKeys(o.name, 0, len(o.hdr.plan))...)
	}
	_, _ = pipe.Exec(b.ctx)
	for _, o := range again {
		n, err := o.existsCmd.Result()
		if err != nil {
			b.fail(o, err)
			continue
		}
		o.state = present
		if n != int64(len(o.hdr.plan)) {
			o.state = partial
		}
	}
}

// exists checks the live ops and removes the damaged and partial objects found.
func (b *batch) exists() {
	b.check()
	for _, o := range b.live() {
		switch o.state {
		case damaged:
			b.s.stats.corrupt.Add(1)
			b.remove(o, 0)
		case partial:
			b.s.stats.partial.Add(1)
			b.remove(o, len(o.hdr.plan))
		}
	}
}

// put writes the live ops' objects that are not stored yet: every chunk, then the
// header, in one pipeline.
func (b *batch) put() {
	b.check()
	var writes []*op
	for _, o := range b.live() {
		switch o.state {
		case present:
			b.s.stats.skippedWrites.Add(1)
			b.finish(o, nil)
		case foreign:
			b.s.stats.conflicts.Add(1)
			b.finish(o, nil)
		default:
			writes = append(writes, o)
		}
	}
	if len(writes) == 0 {
		return
	}
	if err := b.ctx.Err(); err != nil {
		for _, o := range writes {
			b.fail(o, err)
		}
		return
	}
	// The checksums are computed while go-redis writes the chunks, on one goroutine
	// per shard, in the order the pipeline writes that shard's objects: a header is
	// marshalled when the writer reaches it (after its object's chunks), and by then
	// its checksum is usually ready. The call waits for these goroutines before it
	// returns: they read host memory that is the caller's again afterwards.
	hdrs := make([]*pendingHeader, len(writes))
	byShard := map[*shard][]int{}
	for i, o := range writes {
		hdrs[i] = &pendingHeader{ready: make(chan struct{}),
			h: header{format: o.format, bodyLen: o.size, nameSum: xxh3.HashString(o.name), chunkBytes: b.s.cfg.ChunkBytes, plan: o.plan}}
		byShard[o.shard] = append(byShard[o.shard], i)
	}
	var summing sync.WaitGroup
	for _, idx := range byShard {
		summing.Go(func() {
			for _, i := range idx {
				hdrs[i].h.bodySum = sumRuns(writes[i].runs)
				hdrs[i].b = hdrs[i].h.encode()
				close(hdrs[i].ready)
			}
		})
	}
	defer summing.Wait()
	ttl := b.s.cfg.TTL
	pipe := b.s.rdb.Pipeline()
	for i, o := range writes {
		o.spans = mapPlan(o.runs, o.plan)
		o.writeCmds = o.writeCmds[:0]
		for ci, sp := range o.spans {
			val := sp.direct
			if val == nil {
				val = b.stage(sp.n)
				rest := val
				for _, p := range sp.pieces {
					rest = rest[copy(rest, p):]
				}
				b.s.stats.staged.Add(1)
			}
			o.writeCmds = append(o.writeCmds, pipe.Set(b.ctx, chunkKey(o.name, ci), val, ttl))
		}
		if o.hdrOK && len(o.hdr.plan) > len(o.plan) {
			// A partial object cut into more chunks: drop the ones this cut leaves over.
			o.writeCmds = append(o.writeCmds, pipe.Del(b.ctx, chunkKeys(o.name, len(o.plan), len(o.hdr.plan))...))
		}
		o.writeCmds = append(o.writeCmds, pipe.Set(b.ctx, headerKey(o.name), hdrs[i], ttl))
	}
	_, _ = pipe.Exec(b.ctx)
	for _, o := range writes {
		var first error
		wrote := 0
		for _, c := range o.writeCmds {
			if err := c.Err(); err != nil {
				if first == nil {
					first = err
				}
			} else {
				wrote++
			}
		}
		if first != nil {
			if wrote > 0 {
				// Half written: remove it rather than leave it to readers.
				b.remove(o, len(o.plan))
			}
			b.fail(o, first)
			continue
		}
		b.answered(o)
		b.s.stats.writes.Add(1)
		b.s.stats.writeBytes.Add(o.size)
		b.finish(o, nil)
	}
}

// pendingHeader is a header whose checksum a goroutine is computing; go-redis
// marshals it when it writes the command, waiting for the checksum if need be.
type pendingHeader struct {
	h     header
	b     []byte
	ready chan struct{}
}

// MarshalBinary returns the header's bytes once its checksum is known.
func (p *pendingHeader) MarshalBinary() ([]byte, error) {
	<-p.ready
	return p.b, nil
}
