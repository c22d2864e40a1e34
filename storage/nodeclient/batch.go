package nodeclient

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// Exists asks how many leading keys have every part stored in the pool's format.
func (b *Backend) Exists(ctx context.Context, poolName string, keys []pagekey.Key) (int, error) {
	p, _, _, err := b.pool(poolName)
	if err != nil {
		return 0, err
	}
	if err := storage.CheckKeys(keys); err != nil {
		return 0, fmt.Errorf("node client: exists: %w", err)
	}
	parts := p.names.Parts()
	names := make([]string, 0, len(keys)*parts)
	for _, k := range keys {
		names = append(names, storage.ObjectNames(p.spec, k)...)
	}
	if len(names) == 0 {
		return 0, nil
	}
	m, err := b.call(ctx, wire.TypeExists, wire.Exists{Keys: names, Format: p.format})
	if err != nil {
		return 0, err
	}
	r, ok := m.(*wire.ExistsReply)
	if !ok {
		return 0, fmt.Errorf("node service answered %T to Exists: %w", m, storage.ErrIO)
	}
	return min(int(r.Present)/parts, len(keys)), nil
}

// Get reads the keys' objects into the pages: one request, the service copies
// straight into the pool's memory.
func (b *Backend) Get(ctx context.Context, poolName string, keys []pagekey.Key, pages []pool.PageID) []error {
	return b.batch(ctx, wire.TypeGet, poolName, keys, pages)
}

// Put writes the pages as the keys' objects, write-once.
func (b *Backend) Put(ctx context.Context, poolName string, keys []pagekey.Key, pages []pool.PageID) []error {
	return b.batch(ctx, wire.TypePut, poolName, keys, pages)
}

func (b *Backend) batch(ctx context.Context, t wire.Type, poolName string, keys []pagekey.Key, pages []pool.PageID) []error {
	for attempt := 0; ; attempt++ {
		p, seg, conn, runs, err := b.poolRuns(poolName)
		if err != nil {
			return storage.FailAll(len(keys), err)
		}
		if err := storage.CheckBatch(p.spec, keys, pages); err != nil {
			return storage.FailAll(len(keys), fmt.Errorf("node client: %w", err))
		}
		if len(keys) == 0 {
			return nil
		}
		rb, _ := b.reqs.Get().(*requestBuffers)
		if rb == nil {
			rb = new(requestBuffers)
		}
		msg, items := batchRequest(t, p, seg, runs, keys, pages, rb)
		if b.hooks.beforeSend != nil {
			b.hooks.beforeSend()
		}
		m, err := b.callOn(ctx, conn, t, msg)
		// Send encoded the request before callOn returned: nothing refers to
		// its buffers any more.
		rb.recycle(&b.reqs)
		if errors.Is(err, errStale) {
			if attempt == 0 {
				continue // rebuild it with the new connection's segment ids
			}
			b.conns.refused.Add(1) // never sent: its connection went twice
		}
		if err != nil {
			return storage.FailAll(len(keys), err)
		}
		parts := p.names.Parts()
		r, ok := m.(*wire.BatchReply)
		if !ok || len(r.Results) != items {
			return storage.FailAll(len(keys), fmt.Errorf("node service answered %T with a wrong number of results: %w", m, storage.ErrIO))
		}
		out := make([]error, len(keys))
		for i, res := range r.Results {
			k := i / parts
			if res.Status != wire.OK && (out[k] == nil || errors.Is(out[k], storage.ErrNotFound)) {
				out[k] = statusError(res.Status, res.Message)
			}
		}
		return out
	}
}

// requestBuffers are the slices a batch request is built in, reused from one
// batch to the next (Backend.reqs): building a request of 256 small objects
// in fresh slices cost as much as the service's copies of them.
type requestBuffers struct {
	items  []wire.Item
	ranges []wire.Range
	runs   []wire.Run
	buf    []byte
	keyAt  [][2]int32
}

// maxKeptRequest is the most bytes of names a requestBuffers keeps for the
// next batch; a larger one (thousands of parts) is dropped after use.
const maxKeptRequest = 1 << 20

// recycle drops rb's references to the request built in it and gives it to
// pool, unless it grew past maxKeptRequest.
func (rb *requestBuffers) recycle(pool *sync.Pool) {
	if cap(rb.buf) > maxKeptRequest {
		return
	}
	clear(rb.items)
	rb.items, rb.ranges, rb.runs, rb.buf, rb.keyAt = rb.items[:0], rb.ranges[:0], rb.runs[:0], rb.buf[:0], rb.keyAt[:0]
	pool.Put(rb)
}

// batchRequest builds a Get or Put of the keys' objects from and into pages of
// p, whose segment is seg on the connection the request will go on, in rb's
// slices, and says how many items (object parts) it names.
//
// A batch of small objects spends more time naming and describing them than
// the service takes to copy them, so the request is built without an
// allocation per object: every name is appended to one buffer that the keys
// are strings over (unsafe.String: the buffer is not written again until the
// request is encoded and rb recycled), and the items' ranges share one array
// (sized for the one range of a page_first pool's part; an item with more
// grows its own). The request is encoded and dropped; nothing keeps a key.
//
// With runs (the connection's revision is 2 or later) a part whose span is
// equally spaced ranges of one length (a layer_first pool's: one per layer)
// is one wire.Run instead of a range per layer: 61 ranges of an MLA page
// become one run, O(1) bytes of request a part.
func batchRequest(t wire.Type, p *poolReg, seg uint32, runs bool, keys []pagekey.Key, pages []pool.PageID, rb *requestBuffers) (wire.Message, int) {
	parts := p.names.Parts()
	n := len(keys) * parts
	items := slices.Grow(rb.items[:0], n)
	ranges := slices.Grow(rb.ranges[:0], n)
	wruns := rb.runs[:0]
	if runs {
		wruns = slices.Grow(wruns, n)
	}
	buf := slices.Grow(rb.buf[:0], n*(96+len(p.names.ModelPrefix)+len(p.spec.Name)))
	keyAt := slices.Grow(rb.keyAt[:0], n) // each key's start and end in buf
	defer func() { rb.items, rb.ranges, rb.runs, rb.buf, rb.keyAt = items, ranges, wruns, buf, keyAt }()
	// A part's span moves by the same step from each page to the next in every
	// layout (kvlayout.Layout.Offset is affine in the slot, the rest of a span
	// does not depend on the page): computed once a batch, not once an item.
	var fixed [4]kvlayout.Span
	var fixedSteps [4]int64
	spans, steps := fixed[:0], fixedSteps[:0]
	for part := range parts {
		s0, s1 := p.spec.Layout.PageBufferSpan(part, 0), p.spec.Layout.PageBufferSpan(part, 1)
		spans, steps = append(spans, s0), append(steps, s1.Offset-s0.Offset)
	}
	for i, k := range keys {
		for part := range parts {
			start := len(buf)
			if part > 0 && p.tails != nil {
				// Part 0's name with this part's suffix: the key is hexed once a page.
				k0 := keyAt[len(keyAt)-part]
				buf = append(buf, buf[k0[0]:int(k0[1])-len(p.tails[0])]...)
				buf = append(buf, p.tails[part]...)
			} else {
				buf = p.names.AppendObject(buf, k, p.spec.Name, part)
			}
			span := spans[part]
			span.Offset += int64(pages[i]) * steps[part]
			it := wire.Item{Format: p.format}
			switch first := len(ranges); {
			case span.Contiguous():
				ranges = append(ranges, wire.Range{Segment: seg, Offset: uint64(span.Offset), Length: uint64(span.Bytes())})
				it.Ranges = ranges[first:len(ranges):len(ranges)]
			case runs && span.Count <= wire.MaxRunCount && span.Stride >= span.RunBytes:
				wruns = append(wruns, wire.Run{Segment: seg, Offset: uint64(span.Offset), Length: uint64(span.RunBytes),
					Stride: uint64(span.Stride), Count: uint32(span.Count)})
				it.Runs = wruns[len(wruns)-1 : len(wruns) : len(wruns)]
			default:
				for r := 0; r < span.Count; r++ {
					ranges = append(ranges, wire.Range{Segment: seg, Offset: uint64(span.Offset + int64(r)*span.Stride), Length: uint64(span.RunBytes)})
				}
				it.Ranges = ranges[first:len(ranges):len(ranges)]
			}
			// Offsets for now: buf may still move as it grows.
			items = append(items, it)
			keyAt = append(keyAt, [2]int32{int32(start), int32(len(buf))})
		}
	}
	if len(buf) > 0 {
		all := unsafe.String(unsafe.SliceData(buf), len(buf))
		for i, at := range keyAt {
			items[i].Key = all[at[0]:at[1]]
		}
	}
	if t == wire.TypePut {
		return wire.Put{Items: items}, len(items)
	}
	return wire.Get{Items: items}, len(items)
}
