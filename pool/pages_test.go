package pool

import (
	"errors"
	"testing"

	"pgregory.net/rapid"
)

// TestPageAllocatorMatchesModel checks the allocator against a set of allocated pages
// under any sequence of allocations and (valid or invalid) frees.
func TestPageAllocatorMatchesModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 64).Draw(t, "pages")
		a, err := NewPageAllocator(n)
		if err != nil {
			t.Fatal(err)
		}
		model := map[PageID]bool{}
		var held []PageID
		for step := 0; step < 50; step++ {
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0: // allocate
				k := rapid.IntRange(0, n+2).Draw(t, "k")
				got, err := a.Alloc(k)
				if k > n-len(model) {
					if !errors.Is(err, ErrFull) || got != nil {
						t.Fatalf("alloc %d with %d free: %v, %v", k, n-len(model), got, err)
					}
					continue
				}
				if err != nil || len(got) != k {
					t.Fatalf("alloc %d: %v, %v", k, got, err)
				}
				for _, p := range got {
					if model[p] || p < 0 || int(p) >= n {
						t.Fatalf("alloc handed out page %d twice or out of range", p)
					}
					model[p] = true
					held = append(held, p)
				}
			case 1: // free a valid subset
				if len(held) == 0 {
					continue
				}
				k := rapid.IntRange(1, len(held)).Draw(t, "k")
				if err := a.Free(held[:k]); err != nil {
					t.Fatalf("free of held pages: %v", err)
				}
				for _, p := range held[:k] {
					delete(model, p)
				}
				held = held[k:]
			case 2: // free a page that is not allocated, after a valid one
				p := PageID(rapid.IntRange(0, n-1).Draw(t, "p"))
				if model[p] {
					continue
				}
				batch := []PageID{p}
				if len(held) > 0 {
					batch = []PageID{held[0], p}
				}
				if err := a.Free(batch); !errors.Is(err, ErrDoubleFree) {
					t.Fatalf("free of unallocated page %d: %v", p, err)
				}
			case 3: // foreign page, or a page listed twice
				if len(held) > 0 && rapid.Bool().Draw(t, "dup") {
					if err := a.Free([]PageID{held[0], held[0]}); !errors.Is(err, ErrDoubleFree) {
						t.Fatalf("duplicate free: %v", err)
					}
				} else {
					bad := PageID(rapid.SampledFrom([]int{-1, n, n + 100}).Draw(t, "bad"))
					if err := a.Free([]PageID{bad}); !errors.Is(err, ErrForeignPage) {
						t.Fatalf("foreign free %d: %v", bad, err)
					}
				}
			}
			// Failed frees changed nothing.
			if a.FreePages() != n-len(model) {
				t.Fatalf("free pages %d, model %d", a.FreePages(), n-len(model))
			}
			for p := 0; p < n; p++ {
				if a.Allocated(PageID(p)) != model[PageID(p)] {
					t.Fatalf("page %d allocated=%v, model %v", p, a.Allocated(PageID(p)), model[PageID(p)])
				}
			}
		}
	})
}

func TestPageAllocatorBadSize(t *testing.T) {
	for _, n := range []int{0, -1} {
		if _, err := NewPageAllocator(n); !errors.Is(err, ErrConfig) {
			t.Errorf("NewPageAllocator(%d) = %v", n, err)
		}
	}
	a, _ := NewPageAllocator(4)
	if _, err := a.Alloc(-1); !errors.Is(err, ErrConfig) {
		t.Errorf("Alloc(-1) = %v", err)
	}
}
