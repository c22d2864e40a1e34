package offheap

import (
	"testing"
	"unsafe"

	"pgregory.net/rapid"
)

// elem is a 48-byte pointer-free element, the size of the node's records.
type elem struct {
	a uint64
	_ [4]uint64
	f uint64
}

// TestPool: Alloc hands out indexes 0, 1, 2, ... and zeroed elements, reuses
// released indexes last released first (zeroed again), maps a chunk at a time
// (Bytes), keeps element addresses across growth, and Close empties it.
func TestPool(t *testing.T) {
	var p Pool[elem]
	defer p.Close()
	if p.Bytes() != 0 || p.Len() != 0 || p.Live() != 0 {
		t.Fatalf("zero pool: %d bytes, %d handed out, %d live", p.Bytes(), p.Len(), p.Live())
	}
	const n = 1<<chunkShift + 10 // into a second chunk
	first := (*elem)(nil)
	for want := uint32(0); want < n; want++ {
		i, err := p.Alloc()
		if err != nil {
			t.Fatal(err)
		}
		if i != want {
			t.Fatalf("Alloc %d handed out index %d", want, i)
		}
		e := p.Get(i)
		if *e != (elem{}) {
			t.Fatalf("element %d is not zeroed: %+v", i, *e)
		}
		*e = elem{a: uint64(i), f: ^uint64(i)}
		if i == 0 {
			first = e
		}
	}
	if p.Get(0) != first {
		t.Fatal("element 0 moved as the pool grew")
	}
	if want := int64(2<<chunkShift) * int64(unsafe.Sizeof(elem{})); p.Bytes() != want {
		t.Fatalf("Bytes %d, want %d: two chunks", p.Bytes(), want)
	}
	if p.Len() != n || p.Live() != n {
		t.Fatalf("%d handed out, %d live; want %d and %d", p.Len(), p.Live(), n, n)
	}
	for i := range uint32(n) {
		if e := p.Get(i); *e != (elem{a: uint64(i), f: ^uint64(i)}) {
			t.Fatalf("element %d holds %+v", i, *e)
		}
	}
	p.Release(5)
	p.Release(1 << chunkShift)
	if p.Live() != n-2 || p.Len() != n {
		t.Fatalf("after 2 releases: %d live, %d handed out; want %d, %d", p.Live(), p.Len(), n-2, n)
	}
	for _, want := range []uint32{1 << chunkShift, 5, n} { // the freed, last first; then a new one
		i, err := p.Alloc()
		if err != nil {
			t.Fatal(err)
		}
		if i != want {
			t.Fatalf("Alloc after releases handed out %d, want %d", i, want)
		}
		if *p.Get(i) != (elem{}) {
			t.Fatalf("reused element %d is not zeroed", i)
		}
	}
	if p.Live() != n+1 || p.Len() != n+1 {
		t.Fatalf("%d live, %d handed out; want %d", p.Live(), p.Len(), n+1)
	}
	p.Close()
	if p.Bytes() != 0 || p.Len() != 0 || p.Live() != 0 {
		t.Fatalf("closed pool: %d bytes, %d handed out, %d live", p.Bytes(), p.Len(), p.Live())
	}
	if i, err := p.Alloc(); err != nil || i != 0 {
		t.Fatalf("Alloc after Close: %d, %v; want 0, the pool starts over", i, err)
	}
}

// TestPoolModel checks a pool against a map of live indexes and their
// contents under allocs, writes and releases: an index is never handed out
// twice while live, contents stay put, and the counts agree.
func TestPoolModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var p Pool[elem]
		defer p.Close()
		model := map[uint32]uint64{} // live index → its element's a
		t.Repeat(map[string]func(*rapid.T){
			"alloc": func(t *rapid.T) {
				for range rapid.IntRange(1, 100).Draw(t, "n") {
					i, err := p.Alloc()
					if err != nil {
						t.Fatal(err)
					}
					if _, live := model[i]; live {
						t.Fatalf("index %d handed out while live", i)
					}
					v := rapid.Uint64().Draw(t, "v")
					p.Get(i).a = v
					model[i] = v
				}
			},
			"release": func(t *rapid.T) {
				for i := range model { // any one
					p.Release(i)
					delete(model, i)
					return
				}
				t.Skip("nothing live")
			},
			"": func(t *rapid.T) {
				if p.Live() != len(model) || int(p.Len()) < len(model) {
					t.Fatalf("%d live, %d handed out; model %d", p.Live(), p.Len(), len(model))
				}
				for i, v := range model {
					if i >= p.Len() || p.Get(i).a != v {
						t.Fatalf("element %d holds %d, want %d", i, p.Get(i).a, v)
					}
				}
			},
		})
	})
}
