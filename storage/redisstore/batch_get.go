package redisstore

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"github.com/zeebo/xxh3"

	"github.com/stratakv/strata/storage"
)

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
