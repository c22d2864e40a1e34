package nodeclient

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// RegisterPool hands the pool's memfd to the service. The pool must be in shm
// memory (build the group with storage.HostAllocator over this backend). When the
// service is reachable its answer is the result: a refusal (over the client quota,
// a memfd it cannot use) wraps storage.ErrRegistration with the service's reason.
// When it is not, the pool is registered as soon as the client connects, and
// RegisterPool returns nil; the same when the connection is lost (or stops
// answering) during the registration.
func (b *Backend) RegisterPool(ctx context.Context, spec storage.PoolSpec) error {
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("node client: register: %w", err)
	}
	if err := checkKeys(spec); err != nil {
		return err
	}
	fd := spec.Region.Fd()
	if fd < 0 {
		return fmt.Errorf("node client: pool %q is in %s memory, not a memfd the node service can map: build the host group with storage.HostAllocator(backend, ...), which gives it the shm allocator: %w",
			spec.Name, spec.Region.Kind(), storage.ErrRegistration)
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("node client: keep a copy of pool %q's memfd: %v: %w", spec.Name, err, storage.ErrRegistration)
	}
	names := spec.Names
	names.MLA = spec.Layout.Geometry.MLA
	p := &poolReg{spec: spec, names: names, tails: partTails(names, spec.Name), format: uint64(storage.FormatOf(spec.Layout)), fd: dup, size: uint64(spec.Region.Size())}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		_ = unix.Close(dup)
		return fmt.Errorf("node client: %w", storage.ErrClosed)
	}
	old := b.pools[spec.Name]
	b.pools[spec.Name] = p
	// Claimed for the live connection in the same critical section that made it
	// visible: the connector registers it on the next connection, never twice on
	// this one.
	conn := b.conn
	p.conn = conn
	if conn != nil {
		p.users.Add(1)
	}
	b.mu.Unlock()
	if old != nil {
		old.users.Wait()
		_ = unix.Close(old.fd)
	}
	if conn == nil {
		b.log.Warn("node client: the node service is not reachable yet; the pool is registered when it is",
			"pool", spec.Name, "socket", b.cfg.Socket)
		return nil
	}
	err = b.registerLive(ctx, p, conn)
	p.users.Done()
	if errors.Is(err, storage.ErrUnavailable) || errors.Is(err, storage.ErrTimeout) {
		// The connection died (or was dropped for not answering): the next one
		// registers the pool, as if the service had not been reachable.
		b.log.Warn("node client: lost the node service while registering a pool; it is registered on reconnecting",
			"pool", spec.Name, "socket", b.cfg.Socket, "err", err)
		return nil
	}
	return err
}

// registerLive registers p on conn, which serves replies already. A failure
// other than a refusal closes conn: the service may have mapped the segment
// without the client learning its id, and a reconnect registers every pool
// afresh.
func (b *Backend) registerLive(ctx context.Context, p *poolReg, conn *wire.Conn) error {
	m, err := b.callOn(ctx, conn, wire.TypeRegisterSegment, wire.RegisterSegment{Size: p.size, Name: p.spec.Name}, p.fd)
	var seg uint32
	if err == nil {
		if r, ok := m.(*wire.RegisterSegmentReply); ok {
			seg = r.SegmentID
		} else {
			err = fmt.Errorf("node service answered %T to RegisterSegment: %w", m, storage.ErrIO)
		}
	}
	refused := errors.Is(err, storage.ErrRegistration) || errors.Is(err, storage.ErrNotRegistered)
	if refused {
		err = fmt.Errorf("node service refused pool %q: %w: %w", p.spec.Name, err, storage.ErrRegistration)
	}
	b.mu.Lock()
	mine := p.conn == conn
	if mine {
		p.segment, p.refused = seg, nil
		if refused {
			p.refused = err
		}
	}
	b.mu.Unlock()
	if err != nil && !refused && !errors.Is(err, errStale) && mine {
		_ = conn.Close()
	}
	return err
}

// pool returns the registered pool called name, its segment and the connection
// that segment id is valid on: a request built from them must go on that
// connection only.
func (b *Backend) pool(name string) (*poolReg, uint32, *wire.Conn, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, 0, nil, fmt.Errorf("node client: %w", storage.ErrClosed)
	}
	p := b.pools[name]
	switch {
	case p == nil:
		return nil, 0, nil, fmt.Errorf("node client: pool %q: %w", name, storage.ErrNotRegistered)
	case p.refused != nil && p.conn == b.conn:
		return nil, 0, nil, fmt.Errorf("node client: pool %q: %w: %w", name, p.refused, storage.ErrNotRegistered)
	case b.conn == nil || p.conn != b.conn || p.segment == 0:
		return nil, 0, nil, fmt.Errorf("node client: not connected to %s (reconnecting): %w", b.cfg.Socket, storage.ErrUnavailable)
	}
	return p, p.segment, b.conn, nil
}

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
		p, seg, conn, err := b.pool(poolName)
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
		msg, items := batchRequest(t, p, seg, keys, pages, rb)
		if b.hooks.beforeSend != nil {
			b.hooks.beforeSend()
		}
		m, err := b.callOn(ctx, conn, t, msg)
		// Send encoded the request before callOn returned: nothing refers to
		// its buffers any more.
		rb.recycle(&b.reqs)
		if errors.Is(err, errStale) && attempt == 0 {
			continue // rebuild it with the new connection's segment ids
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
	rb.items, rb.ranges, rb.buf, rb.keyAt = rb.items[:0], rb.ranges[:0], rb.buf[:0], rb.keyAt[:0]
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
func batchRequest(t wire.Type, p *poolReg, seg uint32, keys []pagekey.Key, pages []pool.PageID, rb *requestBuffers) (wire.Message, int) {
	parts := p.names.Parts()
	n := len(keys) * parts
	items := slices.Grow(rb.items[:0], n)
	ranges := slices.Grow(rb.ranges[:0], n)
	buf := slices.Grow(rb.buf[:0], n*(96+len(p.names.ModelPrefix)+len(p.spec.Name)))
	keyAt := slices.Grow(rb.keyAt[:0], n) // each key's start and end in buf
	defer func() { rb.items, rb.ranges, rb.buf, rb.keyAt = items, ranges, buf, keyAt }()
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
			first := len(ranges)
			if span.Contiguous() {
				ranges = append(ranges, wire.Range{Segment: seg, Offset: uint64(span.Offset), Length: uint64(span.Bytes())})
			} else {
				for r := 0; r < span.Count; r++ {
					ranges = append(ranges, wire.Range{Segment: seg, Offset: uint64(span.Offset + int64(r)*span.Stride), Length: uint64(span.RunBytes)})
				}
			}
			// Offsets for now: buf may still move as it grows.
			items = append(items, wire.Item{Format: p.format, Ranges: ranges[first:len(ranges):len(ranges)]})
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

// partTails returns each part's name suffix when the names of a page's parts
// differ only in a suffix that does not depend on the key, as SGLang's spelling
// has them ({key}_{rank}_k, {key}_{rank}_v), so that a batch writes each key's
// hex once a page instead of once a part; nil when there is one part, or when
// that does not hold for two keys of different digest sizes (a spelling that
// changed), and every name is then built whole.
func partTails(names pagekey.Names, pool string) [][]byte {
	parts := names.Parts()
	if parts < 2 {
		return nil
	}
	var d1 [pagekey.MaxDigestSize]byte
	var d2 [16]byte
	for i := range d1 {
		d1[i] = byte(0xa5 + 7*i)
	}
	for i := range d2 {
		d2[i] = byte(0x3c + 11*i)
	}
	k1, err1 := pagekey.KeyFromDigest(d1[:])
	k2, err2 := pagekey.KeyFromDigest(d2[:])
	if err1 != nil || err2 != nil {
		return nil
	}
	first := names.Object(k1, pool, 0)
	common := len(first)
	for part := 1; part < parts; part++ {
		other := names.Object(k1, pool, part)
		n := 0
		for n < min(len(first), len(other)) && first[n] == other[n] {
			n++
		}
		common = min(common, n)
	}
	tails := make([][]byte, parts)
	for part := range parts {
		tails[part] = []byte(names.Object(k1, pool, part)[common:])
	}
	for _, k := range []pagekey.Key{k1, k2} {
		base := names.Object(k, pool, 0)
		if !strings.HasSuffix(base, string(tails[0])) {
			return nil
		}
		for part := 1; part < parts; part++ {
			if names.Object(k, pool, part) != base[:len(base)-len(tails[0])]+string(tails[part]) {
				return nil
			}
		}
	}
	return tails
}

// checkKeys reports whether every object name of spec's pages is a key the node
// service's wire accepts (wire.ValidKey: 1 to wire.MaxKey bytes of printable
// ASCII), so that a pool whose model prefix cannot be served is refused when it
// registers rather than failing every Put. Names are longest for the longest
// digest, which is what is checked.
func checkKeys(spec storage.PoolSpec) error {
	var d [pagekey.MaxDigestSize]byte
	key, err := pagekey.KeyFromDigest(d[:])
	if err != nil {
		return fmt.Errorf("node client: pool %q: %v: %w", spec.Name, err, storage.ErrConfig)
	}
	for _, name := range storage.ObjectNames(spec, key) {
		if err := wire.ValidKey(name); err != nil {
			return fmt.Errorf("node client: pool %q (model prefix %q): its object names are not node service keys: %v; use a printable ASCII model prefix short enough for keys of %d bytes: %w",
				spec.Name, spec.Names.ModelPrefix, err, wire.MaxKey, storage.ErrConfig)
		}
	}
	return nil
}
