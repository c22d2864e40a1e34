package nodeclient

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

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
// RegisterPool returns nil.
func (b *Backend) RegisterPool(ctx context.Context, spec storage.PoolSpec) error {
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("node client: register: %w", err)
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
	p := &poolReg{spec: spec, names: names, format: uint64(storage.FormatOf(spec.Layout)), fd: dup, size: uint64(spec.Region.Size())}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		_ = unix.Close(dup)
		return fmt.Errorf("node client: %w", storage.ErrClosed)
	}
	if old := b.pools[spec.Name]; old != nil {
		_ = unix.Close(old.fd)
	}
	b.pools[spec.Name] = p
	connected := b.conn != nil
	b.mu.Unlock()
	if !connected {
		b.log.Warn("node client: the node service is not reachable yet; the pool is registered when it is",
			"pool", spec.Name, "socket", b.cfg.Socket)
		return nil
	}
	return b.registerLive(ctx, p)
}

// registerLive registers p on the live connection.
func (b *Backend) registerLive(ctx context.Context, p *poolReg) error {
	m, err := b.call(ctx, wire.TypeRegisterSegment, wire.RegisterSegment{Size: p.size, Name: p.spec.Name}, p.fd)
	if err != nil {
		if errors.Is(err, storage.ErrRegistration) || errors.Is(err, storage.ErrNotRegistered) {
			err = fmt.Errorf("node service refused pool %q: %w: %w", p.spec.Name, err, storage.ErrRegistration)
			b.mu.Lock()
			p.refused = err
			b.mu.Unlock()
		}
		return err
	}
	r, ok := m.(*wire.RegisterSegmentReply)
	if !ok {
		return fmt.Errorf("node service answered %T to RegisterSegment: %w", m, storage.ErrIO)
	}
	b.mu.Lock()
	p.segment, p.refused = r.SegmentID, nil
	b.mu.Unlock()
	return nil
}

// pool returns the registered pool called name and its current segment.
func (b *Backend) pool(name string) (*poolReg, uint32, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, 0, fmt.Errorf("node client: %w", storage.ErrClosed)
	}
	p := b.pools[name]
	switch {
	case p == nil:
		return nil, 0, fmt.Errorf("node client: pool %q: %w", name, storage.ErrNotRegistered)
	case p.refused != nil:
		return nil, 0, fmt.Errorf("node client: pool %q: %w: %w", name, p.refused, storage.ErrNotRegistered)
	case b.conn == nil || p.segment == 0:
		return nil, 0, fmt.Errorf("node client: not connected to %s (reconnecting): %w", b.cfg.Socket, storage.ErrUnavailable)
	}
	return p, p.segment, nil
}

// Exists asks how many leading keys have every part stored in the pool's format.
func (b *Backend) Exists(ctx context.Context, poolName string, keys []pagekey.Key) (int, error) {
	p, _, err := b.pool(poolName)
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
	p, seg, err := b.pool(poolName)
	if err != nil {
		return storage.FailAll(len(keys), err)
	}
	if err := storage.CheckBatch(p.spec, keys, pages); err != nil {
		return storage.FailAll(len(keys), fmt.Errorf("node client: %w", err))
	}
	if len(keys) == 0 {
		return nil
	}
	parts := p.names.Parts()
	items := make([]wire.Item, 0, len(keys)*parts)
	for i, k := range keys {
		names := storage.ObjectNames(p.spec, k)
		for part, span := range storage.Parts(p.spec, pages[i]) {
			ranges := make([]wire.Range, 0, span.Count)
			if span.Contiguous() {
				ranges = append(ranges, wire.Range{Segment: seg, Offset: uint64(span.Offset), Length: uint64(span.Bytes())})
			} else {
				for r := 0; r < span.Count; r++ {
					ranges = append(ranges, wire.Range{Segment: seg, Offset: uint64(span.Offset + int64(r)*span.Stride), Length: uint64(span.RunBytes)})
				}
			}
			items = append(items, wire.Item{Key: names[part], Format: p.format, Ranges: ranges})
		}
	}
	var msg wire.Message = wire.Get{Items: items}
	if t == wire.TypePut {
		msg = wire.Put{Items: items}
	}
	m, err := b.call(ctx, t, msg)
	if err != nil {
		return storage.FailAll(len(keys), err)
	}
	r, ok := m.(*wire.BatchReply)
	if !ok || len(r.Results) != len(items) {
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
