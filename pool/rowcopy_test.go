package pool

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stratakv/strata/kvlayout"
)

// Geometries whose page_first rows are long enough (32 KiB and more) for the
// sequential row kernel: 1 KiB entries, a multiple of 128 bytes, take copyRunsAVX on
// CPUs with AVX; 1088-byte entries take its run-by-run fallback.
var (
	longRows    = kvlayout.Geometry{Layers: 40, KVHeads: 4, HeadDim: 128, DTypeBytes: 2}
	longRowsOdd = kvlayout.Geometry{Layers: 32, KVHeads: 1, HeadDim: 544, DTypeBytes: 2}
)

// The streaming kernels (row copies that read the skipped layers, prefetching short
// runs, streaming stores) must write exactly what plain copies write, for every
// layout pair, both directions, groups that leave layers before, after and on both
// sides of the run, and destinations at every alignment. It calls copyPageLayers on
// one goroutine, so it checks the assembly kernels under the race detector too,
// whose builds make the copy engine use plain copies.
func TestStreamingLayerCopiesMatchPlainCopies(t *testing.T) {
	kinds := []kvlayout.Kind{kvlayout.LayerFirst, kvlayout.PageFirst, kvlayout.PageFirstDirect}
	moves := []PageMove{{Device: 2, Host: 0}, {Device: 0, Host: 3}, {Device: 3, Host: 1}}
	for _, g := range []kvlayout.Geometry{longRows, longRowsOdd} {
		L := g.Layers
		pf, err := kvlayout.New(g, kvlayout.PageFirst, 4, 4)
		if err != nil {
			t.Fatal(err)
		}
		// Every layout of one geometry and page count has the same size.
		srcPattern, dstPattern := make([]byte, pf.PoolBytes()), make([]byte, pf.PoolBytes())
		for i := range srcPattern {
			srcPattern[i] = byte(i*7 + i>>11 + 3)
			dstPattern[i] = byte(i * 13)
		}
		groups := [][2]int{{0, 1}, {1, L - 1}, {0, L}, {0, L - 3}, {2, L - 3}, {4, 8}, {L - 1, 1}}
		for _, hk := range kinds {
			for _, dk := range kinds {
				hl, _ := kvlayout.New(g, hk, 4, 4)
				dl, _ := kvlayout.New(g, dk, 4, 4)
				for _, toDevice := range []bool{true, false} {
					sl, dstl := hl, dl
					if !toDevice {
						sl, dstl = dl, hl
					}
					for _, grp := range groups {
						for _, align := range []int{0, 16, 8} {
							name := fmt.Sprintf("%v/%v-%v/toDevice=%v/layers=%d+%d/dst+%d", g, hk, dk, toDevice, grp[0], grp[1], align)
							srcBytes := srcPattern[:sl.PoolBytes()]
							plain := make([]byte, dstl.PoolBytes()+64)[align:][:dstl.PoolBytes()]
							streamed := make([]byte, dstl.PoolBytes()+64)[align:][:dstl.PoolBytes()]
							copy(plain, dstPattern)
							copy(streamed, dstPattern)
							copyPageLayers(plain, dstl, srcBytes, sl, grp[0], grp[1], moves, toDevice, false)
							copyPageLayers(streamed, dstl, srcBytes, sl, grp[0], grp[1], moves, toDevice, true)
							if !bytes.Equal(plain, streamed) {
								i := 0
								for plain[i] == streamed[i] {
									i++
								}
								t.Fatalf("%s: streamed copy differs from the plain copy first at byte %d", name, i)
							}
						}
					}
				}
			}
		}
	}
}

// copyRuns must equal run-by-run copies for every run length (multiples of 128 take
// the assembly loop, others the fallback), count, step and destination alignment.
func TestCopyRunsMatchesCopy(t *testing.T) {
	src := make([]byte, 64<<10)
	for i := range src {
		src[i] = byte(i*31 + i>>9 + 7)
	}
	for _, run := range []int64{128, 256, 1024, 1088, 2048, 100} {
		for _, count := range []int{1, 2, 5} {
			for _, steps := range [][2]int64{{run, run}, {4096, run}, {run, 4096}, {8192, 6144}} {
				for _, align := range []int64{0, 32, 16, 8} {
					dst := make([]byte, 48<<10)
					want := make([]byte, 48<<10)
					doff, soff := 64+align, int64(192)
					for i := int64(0); i < int64(count); i++ {
						d, s := doff+i*steps[0], soff+i*steps[1]
						copy(want[d:d+run], src[s:s+run])
					}
					copyRuns(dst, doff, steps[0], src, soff, steps[1], run, count, 512)
					finishRuns()
					if !bytes.Equal(dst, want) {
						t.Fatalf("run %d count %d steps %v dst+%d: copy differs", run, count, steps, align)
					}
				}
			}
		}
	}
}

// groupGate is a LayerGroupPool that records the layer groups and page ranges the
// engine hands it, and holds the group copies that do not start at layer 0 until
// its gate opens.
type groupGate struct {
	*MemDevicePool
	gate chan struct{}

	mu    sync.Mutex
	calls []groupCall
}

type groupCall struct {
	first, count int
	moves        []PageMove
}

func (g *groupGate) GroupsLayers(self DevicePool) bool {
	p, ok := self.(*groupGate)
	return ok && p == g
}

func (g *groupGate) LoadLayer(layer int, host *HostPool, moves []PageMove) error {
	return g.LoadLayers(layer, 1, host, moves)
}

func (g *groupGate) LoadLayers(first, count int, host *HostPool, moves []PageMove) error {
	g.mu.Lock()
	g.calls = append(g.calls, groupCall{first, count, slices.Clone(moves)})
	g.mu.Unlock()
	if first > 0 {
		<-g.gate
	}
	return g.MemDevicePool.LoadLayers(first, count, host, moves)
}

// A load copies layer 0 first, split into jobsPerWorker jobs per worker over
// disjoint page ranges, and closes layer 0 when all of them are done, while the
// other layers (one group, held here) are still copying; the whole transfer then
// completes with every byte in place.
func TestLoadLeadLayerCompletesBeforeTheTail(t *testing.T) {
	host, dev := newGroups(t, kvlayout.PageFirst, kvlayout.LayerFirst, []kvlayout.Geometry{wideEntries}, 12, 12)
	gg := &groupGate{MemDevicePool: dev.Pools[0].(*MemDevicePool), gate: make(chan struct{})}
	dev.Pools[0] = gg
	e, err := NewCopyEngine(CopyConfig{Workers: 2, MinPagesPerJob: 1, LoadLeadLayers: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	var moves []PageMove
	for i := 0; i < 10; i++ {
		fillHostPageViaDevice(t, e, dev, gg.MemDevicePool, host, PageID(i), i)
		moves = append(moves, PageMove{Device: PageID(11 - i), Host: PageID(i)})
	}
	gg.mu.Lock()
	gg.calls = nil
	gg.mu.Unlock()
	tr, err := e.Load(dev, host, moves)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.WaitLayer(ctx, 0, 0); err != nil {
		t.Fatalf("layer 0: %v", err)
	}
	for l := 1; l < wideEntries.Layers; l++ {
		select {
		case <-tr.layerDone[0][l]:
			t.Fatalf("layer %d done while the tail group is held", l)
		default:
		}
	}
	close(gg.gate)
	if err := tr.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for i, m := range moves {
		checkDevice(t, DeviceGroup{Pools: []DevicePool{gg.MemDevicePool}}, m.Device, i)
	}
	gg.mu.Lock()
	defer gg.mu.Unlock()
	covered := map[[2]int][]PageMove{}
	jobs := map[[2]int]int{}
	for _, c := range gg.calls {
		k := [2]int{c.first, c.count}
		covered[k] = append(covered[k], c.moves...)
		jobs[k]++
	}
	wantJobs := min(len(moves), jobsPerWorker*2)
	for _, k := range [][2]int{{0, 1}, {1, wideEntries.Layers - 1}} {
		got := slices.Clone(covered[k])
		slices.SortFunc(got, func(a, b PageMove) int { return int(a.Host - b.Host) })
		if !slices.Equal(got, moves) || jobs[k] != wantJobs {
			t.Errorf("layers %d+%d: %d jobs covering %v, want %d jobs covering every move once", k[0], k[1], jobs[k], got, wantJobs)
		}
	}
	if len(covered) != 2 {
		t.Errorf("groups %v, want the lead layer and the rest", covered)
	}
}

// fillHostPageViaDevice writes logical page lp's pattern into host page hp by
// backing up a scratch device page (the last one) that holds it.
func fillHostPageViaDevice(t *testing.T, e *CopyEngine, dev DeviceGroup, m *MemDevicePool, host *Group, hp PageID, lp int) {
	t.Helper()
	scratch := PageID(m.Layout().Pages - 1)
	fillDevice(DeviceGroup{Pools: []DevicePool{m}}, scratch, lp)
	tr, err := e.Backup(dev, host, []PageMove{{Device: scratch, Host: hp}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}
