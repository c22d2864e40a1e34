package offheap

import (
	"testing"

	"pgregory.net/rapid"
)

// TestTableModel checks the table against a map under inserts and removes
// whose hash bits share a few home slots, so that long probe runs form, wrap
// around the end, and are mended by backward-shift deletion, across growth
// (with the old table still being migrated). Every entry is reachable from its
// home slot, Find finds exactly the indexes its predicate accepts among those
// under the bits, and Entries lists the model.
func TestTableModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tab, err := NewTable()
		if err != nil {
			t.Fatal(err)
		}
		defer tab.Close()
		model := map[uint32]uint32{} // index → hash bits
		next := uint32(1)
		// A few homes near the end of the smallest table, so that runs wrap,
		// and a few shared by many indexes, so that only the predicate tells
		// them apart.
		homes := []uint32{0, 1, 2, 1020, 1022, 1023, 5000, 1 << 31}
		drawBits := func(t *rapid.T) uint32 {
			if rapid.Bool().Draw(t, "clustered") {
				return rapid.SampledFrom(homes).Draw(t, "home")
			}
			return rapid.Uint32().Draw(t, "bits")
		}
		t.Repeat(map[string]func(*rapid.T){
			"insert": func(t *rapid.T) {
				if len(model) > 3000 { // the table has doubled twice by then
					t.Skip("large enough: the table has grown")
				}
				for range rapid.IntRange(1, 200).Draw(t, "n") {
					bits := drawBits(t)
					if err := tab.Insert(next, bits); err != nil {
						t.Fatal(err)
					}
					model[next] = bits
					next++
				}
			},
			"remove": func(t *rapid.T) {
				if len(model) == 0 {
					t.Skip("empty")
				}
				for range rapid.IntRange(1, 50).Draw(t, "n") {
					for idx, bits := range model { // any one
						tab.Remove(idx, bits)
						delete(model, idx)
						break
					}
				}
			},
			"find": func(t *rapid.T) {
				// An index that is there, under its bits, or one under bits
				// that may hold others or none.
				want := rapid.Uint32Range(0, next).Draw(t, "idx")
				bits, ok := model[want]
				if !ok || rapid.Bool().Draw(t, "other bits") {
					bits = drawBits(t)
				}
				var asked []uint32
				got := tab.Find(bits, func(idx uint32) bool {
					asked = append(asked, idx)
					return idx == want
				})
				if b, had := model[want]; had && b == bits {
					if got != want {
						t.Fatalf("Find(%#x) for index %d: %d", bits, want, got)
					}
				} else if got != 0 {
					t.Fatalf("Find(%#x) for index %d, not there under those bits: %d", bits, want, got)
				}
				for _, idx := range asked {
					if b, had := model[idx]; !had || b != bits {
						t.Fatalf("Find(%#x) asked about index %d, not in the table under those bits", bits, idx)
					}
				}
			},
			"": func(t *rapid.T) {
				if tab.Len() != len(model) || tab.Len()*4 > tab.Slots()*3 || tab.old != nil && tab.Len() > tab.Slots() {
					t.Fatalf("table counts %d in %d slots, model %d", tab.Len(), tab.Slots(), len(model))
				}
				// Every entry is reachable from its home slot without crossing
				// an empty slot, which is what lookups rely on, in the new
				// table or in the old one while it is migrated.
				for idx, bits := range model {
					s := slotOf(idx, bits)
					if probeFor(tab.slots, tab.mask, s) < 0 && (tab.old == nil || probeFor(tab.old, tab.oldMask, s) < 0) {
						t.Fatalf("index %d (hash bits %#x) is not reachable from its home", idx, bits)
					}
				}
				n := 0
				tab.Entries(func(idx, bits uint32) {
					n++
					if b, ok := model[idx]; !ok || b != bits {
						t.Fatalf("entry %d under %#x: not in the model, or under other hash bits", idx, bits)
					}
				})
				if n != len(model) {
					t.Fatalf("%d entries in the tables, %d in the model", n, len(model))
				}
				if want := int64(len(tab.slots)+len(tab.old)) * 8; tab.Bytes() != want {
					t.Fatalf("Bytes %d, want %d", tab.Bytes(), want)
				}
			},
		})
	})
}

// TestTableGrowsIncrementally: past a load of 3/4 the table doubles, and the
// old one is moved across a few slots at a time by later inserts and removes,
// not at once; it is gone well before the new one fills, and every entry stays
// findable meanwhile.
func TestTableGrowsIncrementally(t *testing.T) {
	tab, err := NewTable()
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	find := func(idx uint32) uint32 {
		return tab.Find(idx*2654435761, func(i uint32) bool { return i == idx })
	}
	idx := uint32(1)
	for ; tab.Len()+1 <= minSlots*3/4; idx++ {
		if err := tab.Insert(idx, idx*2654435761); err != nil {
			t.Fatal(err)
		}
	}
	if tab.Slots() != minSlots || tab.old != nil {
		t.Fatalf("%d entries: %d slots (old table %v), want %d and none", tab.Len(), tab.Slots(), tab.old != nil, minSlots)
	}
	if err := tab.Insert(idx, idx*2654435761); err != nil {
		t.Fatal(err)
	}
	if tab.Slots() != 2*minSlots || tab.old == nil || tab.cursor != migrateStep {
		t.Fatalf("after the growing insert: %d slots, old table %v, cursor %d; want %d, one, %d",
			tab.Slots(), tab.old != nil, tab.cursor, 2*minSlots, migrateStep)
	}
	if want := int64(3*minSlots) * 8; tab.Bytes() != want {
		t.Fatalf("Bytes while migrating %d, want %d: both tables", tab.Bytes(), want)
	}
	for i := uint32(1); i <= idx; i++ {
		if find(i) != i {
			t.Fatalf("index %d is not found while the table grows", i)
		}
	}
	inserts := 0
	for tab.old != nil {
		idx++
		inserts++
		if err := tab.Insert(idx, idx*2654435761); err != nil {
			t.Fatal(err)
		}
	}
	if want := minSlots/migrateStep - 1; inserts != want {
		t.Fatalf("the old table went after %d more inserts, want %d", inserts, want)
	}
	if tab.Len()*2 > tab.Slots() { // it would need to have ended by 3/4
		t.Fatalf("the migration ended at %d entries of %d slots: too late", tab.Len(), tab.Slots())
	}
	for i := uint32(1); i <= idx; i++ {
		if find(i) != i {
			t.Fatalf("index %d is not found after the table grew", i)
		}
	}
}

// Remove of an index that is not there under the given bits is a bookkeeping
// bug of the caller: it panics rather than corrupt the table.
func TestTableRemoveMissingPanics(t *testing.T) {
	tab, err := NewTable()
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	if err := tab.Insert(7, 42); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ idx, bits uint32 }{{8, 42}, {7, 43}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Remove(%d, %d) did not panic", c.idx, c.bits)
				}
			}()
			tab.Remove(c.idx, c.bits)
		}()
	}
	if tab.Len() != 1 || tab.Find(42, func(i uint32) bool { return i == 7 }) != 7 {
		t.Fatal("a failed Remove changed the table")
	}
}

// Presize gives an empty table the slots for n entries at once: inserting
// them never grows it (no migration, one table to probe), and it is refused
// quietly for a table that holds entries.
func TestTablePresize(t *testing.T) {
	tab, err := NewTable()
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	const n = 100_000
	if err := tab.Presize(n); err != nil {
		t.Fatal(err)
	}
	slots := tab.Slots()
	if slots*3 < n*4 || slots&(slots-1) != 0 {
		t.Fatalf("presized for %d entries: %d slots", n, slots)
	}
	for i := uint32(1); i <= n; i++ {
		if err := tab.Insert(i, i*2654435761); err != nil {
			t.Fatal(err)
		}
		if tab.old != nil || tab.Slots() != slots {
			t.Fatalf("insert %d of a presized table grew it", i)
		}
	}
	for i := uint32(1); i <= n; i++ {
		if got := tab.Find(i*2654435761, func(idx uint32) bool { return idx == i }); got != i {
			t.Fatalf("find %d: %d", i, got)
		}
	}
	if err := tab.Presize(4 * n); err != nil || tab.Slots() != slots {
		t.Fatalf("presize of a table holding entries: %v, %d slots", err, tab.Slots())
	}
}
