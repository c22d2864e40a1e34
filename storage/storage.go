// Package storage defines L3, the tier shared by every engine on a node or in a
// cluster: the Backend interface that the file, node-service and Redis backends
// implement, the pool descriptions they are registered with, and the object
// format rules they share.
//
// A Backend moves whole pages between its store and registered host pools. It is
// batch-first (a batch is up to MaxBatch pages of one pool), write-once (putting a
// key that exists succeeds and moves no data), and reports per key: a batch can
// half succeed. Objects are named as SGLang's Mooncake store names them
// (pagekey.Names), one object per page, pool and buffer (K, V, or the MLA
// latent); an object's bytes are the buffer's bytes in the pool's layout order
// (PageBufferSpan), and every backend records the pool's Format with the object
// and treats an object of another format as a miss, so engines whose layouts
// differ never read each other's bytes as their own.
package storage

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/zeebo/xxh3"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
)

// MaxBatch is the most pages one Exists, Get or Put may name.
const MaxBatch = 128

// PoolSpec describes one host pool of a group to a backend.
type PoolSpec struct {
	// Name is the pool's name in the group ("kv", "draft"); it selects the object
	// names' spelling (pagekey.Names).
	Name string
	// Region is the pool's memory. Backends that move bytes without copies map or
	// pin it; it must come from the allocator the backend names (Allocator).
	Region *hostmem.Region
	// Layout is the pool's geometry and byte order; Layout.PoolBytes() bytes of
	// Region are the pool.
	Layout kvlayout.Layout
	// Names spells the pool's objects: model prefix and tensor-parallel rank (its
	// MLA flag is taken from Layout).
	Names pagekey.Names
}

// Validate reports whether s can be registered.
func (s PoolSpec) Validate() error {
	if err := pool.ValidName(s.Name); err != nil {
		return fmt.Errorf("%w: %w", err, ErrConfig)
	}
	if s.Region == nil || s.Region.Closed() {
		return fmt.Errorf("pool %q: no memory region: %w", s.Name, ErrConfig)
	}
	if err := s.Layout.Validate(); err != nil {
		return fmt.Errorf("pool %q: %w: %w", s.Name, err, ErrConfig)
	}
	if s.Layout.PoolBytes() > s.Region.Size() {
		return fmt.Errorf("pool %q: layout needs %d bytes, region has %d: %w", s.Name, s.Layout.PoolBytes(), s.Region.Size(), ErrConfig)
	}
	return nil
}

// SpecOf describes host pool p for registration.
func SpecOf(p *pool.HostPool, names pagekey.Names) PoolSpec {
	return PoolSpec{Name: p.Name(), Region: p.Region(), Layout: p.Layout(), Names: names}
}

// Backend is an L3 store. Implementations are safe for concurrent use. Every call
// honours its context's deadline.
type Backend interface {
	// Name is a short name for logs and metrics ("file", "node", "redis").
	Name() string
	// Allocator is the memory kind host pools must be allocated from for
	// RegisterPool to accept them; "" means any memory.
	Allocator() hostmem.Kind
	// RegisterPool makes a pool's memory available to Get and Put. A failure
	// (ErrRegistration, with the reason) leaves the backend usable for other pools.
	RegisterPool(ctx context.Context, spec PoolSpec) error
	// Exists reports how many of keys, from the start, exist for pool: every part
	// of each page's object, in the pool's format.
	Exists(ctx context.Context, pool string, keys []pagekey.Key) (int, error)
	// Get reads the objects of keys into the host pages. The result has one entry
	// per key: nil (the page's bytes are in place), ErrNotFound, or a fault. A page
	// whose entry is not nil holds undefined bytes. An error that is not per key
	// (the pool is not registered, the batch is invalid) fails every key.
	Get(ctx context.Context, pool string, keys []pagekey.Key, pages []pool.PageID) []error
	// Put writes the host pages as the objects of keys, write-once: a key that
	// exists is a success and moves no data. One entry per key, like Get.
	Put(ctx context.Context, pool string, keys []pagekey.Key, pages []pool.PageID) []error
	// Close releases the backend. Calls in flight finish or fail; later ones fail
	// with ErrClosed.
	Close() error
}

// Format is a tag of a pool's object byte format: geometry, page size and the
// order of bytes within a page buffer. Two pools with equal formats can read each
// other's objects.
type Format uint64

// FormatOf computes l's object format. PageFirst orders a page buffer (slot,
// layer); LayerFirst and PageFirstDirect order it (layer, slot).
func FormatOf(l kvlayout.Layout) Format {
	g := l.Geometry
	order := uint64(0)
	if l.Kind == kvlayout.PageFirst {
		order = 1
	}
	var b []byte
	for _, v := range []uint64{1, uint64(g.Layers), uint64(g.KVHeads), uint64(g.HeadDim), uint64(g.LatentDim), uint64(g.DTypeBytes), uint64(l.PageSize), order} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	if g.MLA {
		b = append(b, 1)
	}
	return Format(xxh3.Hash(b))
}

// CheckKeys validates the keys of an Exists, Get or Put batch: at most MaxBatch,
// none empty.
func CheckKeys(keys []pagekey.Key) error {
	if len(keys) > MaxBatch {
		return fmt.Errorf("batch of %d keys, at most %d: %w", len(keys), MaxBatch, ErrBatch)
	}
	for i, k := range keys {
		if k.IsZero() {
			return fmt.Errorf("key %d is empty: %w", i, ErrBatch)
		}
	}
	return nil
}

// CheckBatch validates a Get or Put batch against a pool layout.
func CheckBatch(spec PoolSpec, keys []pagekey.Key, pages []pool.PageID) error {
	if err := CheckKeys(keys); err != nil {
		return err
	}
	if len(keys) != len(pages) {
		return fmt.Errorf("%d keys for %d pages: %w", len(keys), len(pages), ErrBatch)
	}
	for _, p := range pages {
		if p < 0 || int(p) >= spec.Layout.Pages {
			return fmt.Errorf("page %d outside pool %q of %d pages: %w", p, spec.Name, spec.Layout.Pages, ErrBatch)
		}
	}
	return nil
}

// FailAll returns a result with err for each of n keys.
func FailAll(n int, err error) []error {
	out := make([]error, n)
	for i := range out {
		out[i] = err
	}
	return out
}

// Parts returns the byte spans of page's object parts in the pool's region, one
// per buffer (K then V, or the MLA latent alone), each as the runs of the page
// buffer in the pool's layout order.
func Parts(spec PoolSpec, page pool.PageID) []kvlayout.Span {
	n := spec.Layout.Geometry.Buffers()
	out := make([]kvlayout.Span, n)
	for b := 0; b < n; b++ {
		out[b] = spec.Layout.PageBufferSpan(b, int(page))
	}
	return out
}

// ObjectNames returns the names of key's object parts for spec, in buffer order.
func ObjectNames(spec PoolSpec, key pagekey.Key) []string {
	names := spec.Names
	names.MLA = spec.Layout.Geometry.MLA
	return names.Objects(key, spec.Name)
}

// Reconnector is implemented by a Backend that loses and regains its service by
// itself (the node service client reconnects and registers every pool again).
// Callers that stop using a backend after a fault (hicache's backoff) compare
// Epoch with the value they saw at the fault: a different value means the
// backend has connected again since, with its pools registered, so it is worth
// using at once instead of at the end of the backoff.
type Reconnector interface {
	// Epoch counts the backend's completed (re)connections, each with every pool
	// registered again. It never decreases.
	Epoch() uint64
}

// EpochOf returns b's Epoch, looking through decorators (Unwrap), or 0 when no
// backend in the chain reconnects by itself.
func EpochOf(b Backend) uint64 {
	for b != nil {
		if r, ok := b.(Reconnector); ok {
			return r.Epoch()
		}
		u, ok := b.(interface{ Unwrap() Backend })
		if !ok {
			return 0
		}
		b = u.Unwrap()
	}
	return 0
}

// ContentTracker is implemented by a Backend whose stored objects can vanish
// all at once while the backend itself comes back: a node service that
// restarted with an empty arena (a cold start: no arena file, a reboot, an
// incompatible file). A cache that backed pages up compares ContentEpoch with
// the value it saw before: a different value means what it stored may be
// gone, and it backs up again what it still holds (hicache does, at the lowest
// priority). A warm restart that kept the objects does not move it.
type ContentTracker interface {
	// ContentEpoch counts the times the backend found its store emptied; it
	// never decreases.
	ContentEpoch() uint64
}

// ContentEpochOf returns b's ContentEpoch, looking through decorators
// (Unwrap), or 0 when no backend in the chain tracks its contents.
func ContentEpochOf(b Backend) uint64 {
	for b != nil {
		if r, ok := b.(ContentTracker); ok {
			return r.ContentEpoch()
		}
		u, ok := b.(interface{ Unwrap() Backend })
		if !ok {
			return 0
		}
		b = u.Unwrap()
	}
	return 0
}
