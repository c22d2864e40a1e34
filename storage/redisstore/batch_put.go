package redisstore

import (
	"sync"

	"github.com/zeebo/xxh3"
)

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
