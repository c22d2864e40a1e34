package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/kvlayout"
)

// wideEntries has 1 KiB layer entries, long enough for the streaming and prefetching
// copy (minStreamingRun), and 5 layers, so that groups of 2 and 3 leave a short last
// group.
var wideEntries = kvlayout.Geometry{Layers: 5, KVHeads: 4, HeadDim: 128, DTypeBytes: 2}

// Layer groups of every size and loads led by every number of layers, including
// groups that do not divide the layer count and ones larger than it, must move exactly the bytes that layer-by-layer copies move,
// for every pair of layouts and both directions, with every layer completing.
func TestLayerGroupsRoundTripEveryLayoutPair(t *testing.T) {
	kinds := []kvlayout.Kind{kvlayout.LayerFirst, kvlayout.PageFirst, kvlayout.PageFirstDirect}
	for _, geoms := range [][]kvlayout.Geometry{{wideEntries, testDraft}, {testTarget}, {testMLA}} {
		for _, hk := range kinds {
			for _, dk := range kinds {
				for _, c := range [][2]int{{1, -1}, {2, -1}, {3, -1}, {5, -1}, {9, -1}, {2, 1}, {3, 2}, {1, 5}, {2, 7}} {
					t.Run(fmt.Sprintf("%v/%v-%v/groups=%d/lead=%d", geoms[0], hk, dk, c[0], c[1]), func(t *testing.T) {
						roundTripWithGroups(t, hk, dk, geoms, CopyConfig{Workers: 2, MinPagesPerJob: 1, LayersPerJob: c[0], LoadLeadLayers: c[1]})
					})
				}
			}
		}
	}
}

func roundTripWithGroups(t *testing.T, hk, dk kvlayout.Kind, geoms []kvlayout.Geometry, cfg CopyConfig) {
	host, dev := newGroups(t, hk, dk, geoms, 6, 8)
	e, err := NewCopyEngine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	ctx := context.Background()
	for p := 0; p < 8; p++ {
		fillDevice(dev, PageID(p), p)
	}
	tr, err := e.Backup(dev, host, []PageMove{{Device: 1, Host: 5}, {Device: 3, Host: 0}, {Device: 6, Host: 2}, {Device: 7, Host: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for p := 0; p < 8; p++ {
		fillDevice(dev, PageID(p), 100+p)
	}
	tr, err = e.Load(dev, host, []PageMove{{Device: 7, Host: 5}, {Device: 0, Host: 0}, {Device: 4, Host: 2}, {Device: 2, Host: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for pi, p := range dev.Pools {
		for l := 0; l < p.Layout().Geometry.Layers; l++ {
			if err := tr.WaitLayer(ctx, pi, l); err != nil {
				t.Fatalf("pool %d layer %d: %v", pi, l, err)
			}
		}
	}
	if err := tr.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	checkDevice(t, dev, 7, 1)
	checkDevice(t, dev, 0, 3)
	checkDevice(t, dev, 4, 6)
	checkDevice(t, dev, 2, 7)
	checkDevice(t, dev, 5, 105) // not loaded: keeps its bytes
	var want int64
	for _, p := range dev.Pools {
		want += 2 * 4 * p.Layout().PageBytes()
	}
	if s := e.Stats(); s.CopiedBytes != want {
		t.Fatalf("copied %d bytes, want %d", s.CopiedBytes, want)
	}
}

// A pool that wraps a MemDevicePool's per-layer copies must not be copied through
// the embedded group methods, which would bypass its wrapper.
func TestWrappedPoolsDoNotGroupLayers(t *testing.T) {
	_, dev := newGroups(t, kvlayout.PageFirst, kvlayout.LayerFirst, []kvlayout.Geometry{testTarget}, 4, 4)
	m := dev.Pools[0].(*MemDevicePool)
	if !m.GroupsLayers(m) {
		t.Fatal("a MemDevicePool must group its own layers")
	}
	for _, w := range []DevicePool{&gatedDevice{MemDevicePool: m}, failingDevice{m}} {
		if m.GroupsLayers(w) || w.(LayerGroupPool).GroupsLayers(w) {
			t.Fatalf("%T: grouped through the embedded pool", w)
		}
	}
	other, _ := NewMemDevicePool("kv", m.Layout(), testAllocator(t, hostmem.Mmap))
	defer other.Close()
	if m.GroupsLayers(other) {
		t.Fatal("grouped another pool's copies")
	}
}

func TestLayerGroupRangeIsChecked(t *testing.T) {
	host, dev := newGroups(t, kvlayout.PageFirst, kvlayout.LayerFirst, []kvlayout.Geometry{testTarget}, 4, 4)
	m := dev.Pools[0].(*MemDevicePool)
	hp := host.Target()
	moves := []PageMove{{0, 0}}
	for _, r := range [][2]int{{-1, 2}, {0, 0}, {2, 2}, {0, 4}} {
		if err := m.LoadLayers(r[0], r[1], hp, moves); !errors.Is(err, ErrConfig) {
			t.Errorf("load layers %d+%d: %v", r[0], r[1], err)
		}
		if err := m.BackupLayers(r[0], r[1], hp, moves); !errors.Is(err, ErrConfig) {
			t.Errorf("backup layers %d+%d: %v", r[0], r[1], err)
		}
	}
	if err := m.LoadLayers(0, 3, hp, []PageMove{{4, 0}}); !errors.Is(err, ErrForeignPage) {
		t.Errorf("page out of range: %v", err)
	}
	if _, err := NewCopyEngine(CopyConfig{Workers: 1, MinPagesPerJob: 1, LayersPerJob: -1}); !errors.Is(err, ErrConfig) {
		t.Errorf("negative layers per job: %v", err)
	}
}

// copyRunPrefetch must equal copy whatever it is told to prefetch, including nothing
// and addresses past its source.
func TestPrefetchingCopyMatchesCopy(t *testing.T) {
	src := make([]byte, 8192+64)
	for i := range src {
		src[i] = byte(i*31 + 7)
	}
	for _, n := range []int{0, 1, 63, 1024, 1088, 2049, 4096} {
		for _, dOff := range []int{0, 1, 16} {
			for _, next := range [][2]int{{0, 0}, {4096, 4096}, {8192, 64}, {100, 37}} {
				dst := make([]byte, n+64)
				want := make([]byte, n+64)
				copy(want[dOff:dOff+n], src[:n])
				copyRunPrefetch(dst[dOff:dOff+n], src[:n], src[next[0]:next[0]+next[1]])
				finishRuns()
				if !bytes.Equal(dst, want) {
					t.Fatalf("n=%d dst+%d next %v: copy differs", n, dOff, next)
				}
			}
		}
	}
}

func TestLayerGroupsCoverEveryLayerOnce(t *testing.T) {
	for _, c := range []struct {
		cfg  CopyConfig
		dir  Direction
		L    int
		want [][2]int
	}{
		{CopyConfig{LayersPerJob: 8, LoadLeadLayers: 2}, Load, 32, [][2]int{{0, 2}, {2, 30}}},
		{CopyConfig{LayersPerJob: 8, LoadLeadLayers: 2}, Backup, 20, [][2]int{{0, 8}, {8, 8}, {16, 4}}},
		{CopyConfig{LayersPerJob: 8, LoadLeadLayers: 40}, Load, 32, [][2]int{{0, 32}}},
		{CopyConfig{LayersPerJob: 3, LoadLeadLayers: -1}, Load, 5, [][2]int{{0, 3}, {3, 2}}},
		{CopyConfig{LayersPerJob: 1, LoadLeadLayers: -1}, Load, 2, [][2]int{{0, 1}, {1, 1}}},
	} {
		got := c.cfg.layerGroups(c.dir, c.L)
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%+v %v of %d layers: groups %v, want %v", c.cfg, c.dir, c.L, got, c.want)
		}
	}
}
