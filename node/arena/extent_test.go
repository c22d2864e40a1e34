package arena

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/stratakv/strata/internal/memstat"
)

func TestExtentsBestFitLowestOffset(t *testing.T) {
	x := NewExtents(100)
	// Carve [0,100) into a, hole 10, b, hole 5, c, hole 10, d, tail.
	offs := map[string]int64{}
	for _, s := range []struct {
		name string
		n    int64
	}{{"a", 5}, {"h1", 10}, {"b", 5}, {"h2", 5}, {"c", 5}, {"h3", 10}, {"d", 5}} {
		off, ok := x.Alloc(s.n)
		if !ok {
			t.Fatalf("alloc %s", s.name)
		}
		offs[s.name] = off
	}
	for _, h := range []string{"h1", "h2", "h3"} {
		if err := x.Free(offs[h], map[string]int64{"h1": 10, "h2": 5, "h3": 10}[h]); err != nil {
			t.Fatal(err)
		}
	}
	// Free: [5,+10) [20,+5) [30,+10) [45,+55).
	if got := x.FreeExtents(); got != 4 {
		t.Fatalf("%d free extents, want 4", got)
	}
	for _, c := range []struct{ n, want int64 }{
		{4, 20},  // the 5-unit hole is the best fit
		{8, 5},   // two 10-unit holes: the lower one
		{10, 30}, // the other 10-unit hole, exactly
		{11, 45}, // only the tail fits
	} {
		off, ok := x.Alloc(c.n)
		if !ok || off != c.want {
			t.Fatalf("alloc %d: got %d %v, want %d", c.n, off, ok, c.want)
		}
		if err := x.Check(); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := x.Alloc(50); ok {
		t.Fatal("alloc 50 of 44 free in the tail succeeded")
	}
	if x.LargestFree() != 44 {
		t.Fatalf("largest free %d, want 44", x.LargestFree())
	}
}

// TestExtentsNeighbours covers what region eviction walks: the free extents from
// the largest down, and the allocated extent that ends where a free one begins.
func TestExtentsNeighbours(t *testing.T) {
	x := NewExtents(100)
	var offs []int64
	for _, n := range []int64{5, 10, 5, 5, 5, 10, 5} {
		off, ok := x.Alloc(n)
		if !ok {
			t.Fatalf("alloc %d", n)
		}
		offs = append(offs, off)
	}
	for _, i := range []int{1, 3, 5} {
		if err := x.Free(offs[i], map[int]int64{1: 10, 3: 5, 5: 10}[i]); err != nil {
			t.Fatal(err)
		}
	}
	// Free: [5,+10) [20,+5) [30,+10) [45,+55): largest first, of equal lengths
	// the highest offset first.
	var got [][2]int64
	x.FreeListDescending(func(off, n int64) bool { got = append(got, [2]int64{off, n}); return true })
	if want := [][2]int64{{45, 55}, {30, 10}, {5, 10}, {20, 5}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("free extents largest first: %v, want %v", got, want)
	}
	got = got[:0]
	x.FreeListDescending(func(off, n int64) bool { got = append(got, [2]int64{off, n}); return len(got) < 2 })
	if len(got) != 2 {
		t.Fatalf("the walk did not stop when fn returned false: %v", got)
	}
	for _, c := range []struct{ free, want int64 }{{5, 0}, {20, 15}, {30, 25}, {45, 40}, {0, -1}, {7, -1}} {
		if got := x.AllocatedBefore(c.free); got != c.want {
			t.Fatalf("allocated extent ending at %d starts at %d, want %d", c.free, got, c.want)
		}
	}
	if err := x.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestExtentsRefuseBadFrees(t *testing.T) {
	x := NewExtents(64)
	off, _ := x.Alloc(8)
	for _, c := range []struct {
		name    string
		off, n  int64
		wantErr bool
	}{
		{"wrong length", off, 4, true},
		{"inside", off + 1, 7, true},
		{"never allocated", 32, 8, true},
		{"negative", -8, 8, true},
		{"right", off, 8, false},
		{"double free", off, 8, true},
	} {
		before := snapshot(x)
		err := x.Free(c.off, c.n)
		if c.wantErr {
			if !errors.Is(err, ErrExtent) {
				t.Fatalf("%s: got %v, want ErrExtent", c.name, err)
			}
			if after := snapshot(x); after != before {
				t.Fatalf("%s: a refused free changed the allocator: %v to %v", c.name, before, after)
			}
		} else if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if err := x.Check(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	if x.FreeExtents() != 1 || x.LargestFree() != 64 {
		t.Fatalf("after freeing everything: %d extents, largest %d", x.FreeExtents(), x.LargestFree())
	}
}

func TestExtentsAllocRefusesNonPositive(t *testing.T) {
	x := NewExtents(8)
	for _, n := range []int64{0, -1} {
		if _, ok := x.Alloc(n); ok {
			t.Fatalf("alloc %d succeeded", n)
		}
	}
	if _, ok := NewExtents(0).Alloc(1); ok {
		t.Fatal("alloc from an empty allocator succeeded")
	}
}

type extentsState struct {
	free, used   int64
	extents      int
	largest      int64
	allocatedExt int
}

func snapshot(x *Extents) extentsState {
	return extentsState{x.FreeUnits(), x.UsedUnits(), x.FreeExtents(), x.LargestFree(), x.AllocatedExtents()}
}

// extentModel is the reference: one owner per unit, -1 when free.
type extentModel struct {
	owner []int
	ext   map[int][2]int64 // id → offset, length
	next  int
}

// runs are the model's maximal free runs.
func (m *extentModel) runs() [][2]int64 {
	var out [][2]int64
	for i := 0; i < len(m.owner); {
		if m.owner[i] >= 0 {
			i++
			continue
		}
		j := i
		for j < len(m.owner) && m.owner[j] < 0 {
			j++
		}
		out = append(out, [2]int64{int64(i), int64(j - i)})
		i = j
	}
	return out
}

func TestExtentsModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		size := rapid.Int64Range(1, 200).Draw(t, "size")
		x := NewExtents(size)
		m := &extentModel{owner: make([]int, size), ext: map[int][2]int64{}}
		for i := range m.owner {
			m.owner[i] = -1
		}
		check := func() {
			if err := x.Check(); err != nil {
				t.Fatal(err)
			}
			runs := m.runs()
			var free, largest int64
			for _, r := range runs {
				free += r[1]
				largest = max(largest, r[1])
			}
			if x.FreeUnits() != free || x.FreeExtents() != len(runs) || x.LargestFree() != largest || x.AllocatedExtents() != len(m.ext) {
				t.Fatalf("allocator: %+v; model: free %d in %d runs, largest %d, %d allocated", snapshot(x), free, len(runs), largest, len(m.ext))
			}
		}
		t.Repeat(map[string]func(*rapid.T){
			"alloc": func(t *rapid.T) {
				n := rapid.Int64Range(1, size).Draw(t, "n")
				// Best fit by the model: the shortest run that holds n, lowest offset first.
				want := int64(-1)
				var wantLen int64
				for _, r := range m.runs() {
					if r[1] >= n && (want < 0 || r[1] < wantLen) {
						want, wantLen = r[0], r[1]
					}
				}
				off, ok := x.Alloc(n)
				if ok != (want >= 0) || ok && off != want {
					t.Fatalf("alloc %d: got %d %v, best fit is %d", n, off, ok, want)
				}
				if !ok {
					return
				}
				m.next++
				for i := off; i < off+n; i++ {
					if m.owner[i] >= 0 {
						t.Fatalf("alloc %d at %d overlaps extent %d", n, off, m.owner[i])
					}
					m.owner[i] = m.next
				}
				m.ext[m.next] = [2]int64{off, n}
			},
			"free": func(t *rapid.T) {
				if len(m.ext) == 0 {
					t.Skip("nothing allocated")
				}
				id := rapid.SampledFrom(mapKeys(m.ext)).Draw(t, "id")
				e := m.ext[id]
				if err := x.Free(e[0], e[1]); err != nil {
					t.Fatal(err)
				}
				for i := e[0]; i < e[0]+e[1]; i++ {
					m.owner[i] = -1
				}
				delete(m.ext, id)
			},
			"bad free": func(t *rapid.T) {
				off := rapid.Int64Range(-1, size).Draw(t, "off")
				n := rapid.Int64Range(0, size).Draw(t, "n")
				for _, e := range m.ext {
					if e[0] == off && e[1] == n {
						t.Skip("that is a good free")
					}
				}
				before := snapshot(x)
				if err := x.Free(off, n); !errors.Is(err, ErrExtent) {
					t.Fatalf("free [%d, +%d) that is not allocated: %v", off, n, err)
				}
				if after := snapshot(x); after != before {
					t.Fatalf("refused free changed the allocator")
				}
			},
			"": func(t *rapid.T) { check() },
		})
		// Freeing everything leaves one extent of the whole size.
		for id, e := range m.ext {
			if err := x.Free(e[0], e[1]); err != nil {
				t.Fatal(err)
			}
			delete(m.ext, id)
		}
		if err := x.Check(); err != nil {
			t.Fatal(err)
		}
		if x.FreeExtents() != 1 || x.LargestFree() != size || x.FreeUnits() != size {
			t.Fatalf("after freeing everything: %+v, want one extent of %d", snapshot(x), size)
		}
	})
}

// mapKeys is m's keys sorted, so that rapid's draws from them replay.
func mapKeys[K cmp.Ordered, V any](m map[K]V) []K {
	return slices.Sorted(maps.Keys(m))
}

func BenchmarkExtentsAllocFree(b *testing.B) {
	// 64 GiB of 4 KiB units, objects of 16 to 2048 units (64 KiB to 8 MiB), kept
	// about 90 % full so the free extents are many and scattered.
	const size = 16 << 20
	x := NewExtents(size)
	type ext struct{ off, n int64 }
	var live []ext
	rng := uint64(1)
	next := func() uint64 { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng }
	var used int64
	for used < size*9/10 {
		n := int64(16 << (next() % 8))
		off, ok := x.Alloc(n)
		if !ok {
			break
		}
		live = append(live, ext{off, n})
		used += n
	}
	b.ResetTimer()
	for b.Loop() {
		i := int(next() % uint64(len(live)))
		e := live[i]
		if err := x.Free(e.off, e.n); err != nil {
			b.Fatal(err)
		}
		n := int64(16 << (next() % 8))
		off, ok := x.Alloc(n)
		if !ok {
			n = e.n
			off, _ = x.Alloc(n)
		}
		live[i] = ext{off, n}
	}
	b.ReportMetric(float64(x.FreeExtents()), "free-extents")
}

// The extent allocator's words (8 bytes a unit) live outside the Go heap, as
// the index does: a 64 GiB arena of 4 KiB units would otherwise add 128 MiB to
// what the collector paces itself by.
func TestExtentsWordsAreOffTheGoHeap(t *testing.T) {
	const units = 1 << 24
	runtime.GC()
	before := memstat.HeapInuse()
	x := NewExtents(units)
	if off, ok := x.Alloc(units / 2); !ok || x.Free(off, units/2) != nil {
		t.Fatal("alloc and free of half the units")
	}
	grew := int64(memstat.HeapInuse()) - int64(before)
	if grew > 8<<20 {
		t.Fatalf("the Go heap grew by %d bytes for an allocator of %d units (its words are %d bytes)", grew, units, x.WordBytes())
	}
	if err := x.Check(); err != nil {
		t.Fatal(err)
	}
	runtime.KeepAlive(x)
}
