// Package storagetest is the conformance suite that every storage.Backend runs:
// real host pool groups (target, draft, MLA; page-first and layer-first layouts)
// moved through the backend, byte for byte, with the per-key error contract of
// storage.Backend checked case by case.
//
// A backend's test calls Run with a constructor:
//
//	func TestConformance(t *testing.T) {
//		root := t.TempDir()
//		storagetest.Run(t, func(t *testing.T, shared string) storage.Backend {
//			s, err := file.New(file.DefaultConfig(filepath.Join(root, shared)))
//			if err != nil {
//				t.Fatal(err)
//			}
//			return s
//		})
//	}
package storagetest

import (
	"errors"
	"testing"

	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// Run runs the conformance suite against backends made by newBackend.
//
// newBackend returns a new Backend over the store named shared: the first call
// with a given shared string must give an empty store, and later calls with the
// same string (within the same subtest) must give further Backends over that same
// store, as two engine processes see it (for a file backend, the same directory;
// for a service, the same service with a fresh client). shared is a short name of
// [a-z0-9-] that the suite never reuses across subtests, so it can be used as a
// directory name or key prefix. The suite closes every Backend it makes.
func Run(t *testing.T, newBackend func(t *testing.T, shared string) storage.Backend) {
	s := &suite{newBackend: newBackend}
	t.Run("allocator", s.testAllocator)
	t.Run("round-trip", func(t *testing.T) { s.testRoundTrip(t, "rt-page-first", kvlayout.PageFirst, mhaPools) })
	t.Run("round-trip-layer-first", func(t *testing.T) { s.testRoundTrip(t, "rt-layer-first", kvlayout.LayerFirst, mhaPools) })
	t.Run("round-trip-page-first-direct", func(t *testing.T) {
		s.testRoundTrip(t, "rt-page-first-direct", kvlayout.PageFirstDirect, mhaPools)
	})
	t.Run("round-trip-mla", func(t *testing.T) { s.testRoundTrip(t, "rt-mla", kvlayout.PageFirst, mlaPools) })
	t.Run("round-trip-mla-layer-first", func(t *testing.T) { s.testRoundTrip(t, "rt-mla-layer-first", kvlayout.LayerFirst, mlaPools) })
	t.Run("missing", s.testMissing)
	t.Run("write-once", s.testWriteOnce)
	t.Run("batch", s.testBatch)
	t.Run("formats", s.testFormats)
	t.Run("shared-store", s.testShared)
	t.Run("context", s.testContext)
	t.Run("concurrency", s.testConcurrency)
	t.Run("close", s.testClose)
}

// Geometries: small pools so the suite runs in well under a second, with a target
// part of exactly 4 KiB (so direct-I/O backends meet aligned host memory), a draft
// part of 128 bytes and an MLA part of an odd size (unaligned everything).
var (
	// TargetGeometry is the suite's target model: 2 layers, 4 KV heads of dim 64, 2-byte dtype.
	TargetGeometry = kvlayout.Geometry{Layers: 2, KVHeads: 4, HeadDim: 64, DTypeBytes: 2}
	// DraftGeometry is the suite's EAGLE draft model: 1 layer, 2 KV heads of dim 8.
	DraftGeometry = kvlayout.Geometry{Layers: 1, KVHeads: 2, HeadDim: 8, DTypeBytes: 2}
	// MLAGeometry is the suite's MLA model: 3 layers, a latent of 36, 2-byte dtype.
	MLAGeometry = kvlayout.Geometry{Layers: 3, MLA: true, LatentDim: 36, DTypeBytes: 2}

	mhaPools = []pool.PoolSpec{{Name: pagekey.TargetPool, Geometry: TargetGeometry}, {Name: pagekey.DraftPool, Geometry: DraftGeometry}}
	mlaPools = []pool.PoolSpec{{Name: pagekey.TargetPool, Geometry: MLAGeometry}, {Name: pagekey.DraftPool, Geometry: DraftGeometry}}
)

const (
	// PageSize is the suite's tokens per page.
	PageSize = 4
	// pages is the host pages of each group the suite builds.
	pages = 64
)

// names is how the suite spells its objects.
var names = pagekey.Names{ModelPrefix: "conformance", TPRank: 0}

type suite struct {
	newBackend func(t *testing.T, shared string) storage.Backend
}

// backend makes a Backend over the store shared and closes it when t ends.
func (s *suite) backend(t *testing.T, shared string) storage.Backend {
	t.Helper()
	b := s.newBackend(t, shared)
	if b == nil {
		t.Fatal("newBackend returned nil")
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil && !errors.Is(err, storage.ErrClosed) {
			t.Errorf("close %s backend: %v", b.Name(), err)
		}
	})
	return b
}

// registered makes a Backend over the store shared, with a group of pools in
// layout registered on it: how most cases start.
func (s *suite) registered(t *testing.T, shared string, layout kvlayout.Kind, pools []pool.PoolSpec) (storage.Backend, *Group) {
	t.Helper()
	b := s.backend(t, shared)
	g := NewGroup(t, b, layout, PageSize, pools)
	Register(t, b, g)
	return b, g
}
