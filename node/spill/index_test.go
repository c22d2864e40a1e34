package spill

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// testHash is the i-th hash of a small pool: with clustered, its first 32 bits
// (the table's) are one of a few values, some at the end of the smallest
// table, so that many hashes share a home slot, probe runs wrap around, and
// only the full hash tells them apart.
func testHash(i int, clustered bool) [16]byte {
	var h [16]byte
	binary.LittleEndian.PutUint64(h[8:], uint64(i)*0x9e3779b97f4a7c15+1)
	bits := uint32(uint64(i) * 0x9e3779b97f4a7c15 >> 32)
	if clustered {
		bits = []uint32{0, 1, 1021, 1023, 2047, 77}[i%6]
	}
	binary.LittleEndian.PutUint32(h[:4], bits)
	binary.LittleEndian.PutUint32(h[4:8], uint32(i))
	return h
}

// TestIndexModel checks the index against a map under adds (new keys and
// replacements, pending ones committed or aborted later), removes, listings
// of a segment's live records and segment drops, across table growth and
// with hashes that share the table's bits: every indexed hash finds its own
// entry, others find nothing, a listing and a drop find exactly the segment's
// live objects.
func TestIndexModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		x, err := newIndex()
		if err != nil {
			t.Fatal(err)
		}
		defer x.close()
		const segs = 4
		var heads [segs]uint32
		model := map[[16]byte]entry{}
		pending := map[[16]byte]uint32{} // pending entries' records
		pool := rapid.IntRange(50, 2000).Draw(t, "pool")
		anyPending := func(t *rapid.T) ([16]byte, uint32, bool) {
			if len(pending) == 0 {
				return [16]byte{}, 0, false
			}
			var hs [][16]byte
			for h := range pending {
				hs = append(hs, h)
			}
			slices.SortFunc(hs, func(a, b [16]byte) int { return bytes.Compare(a[:], b[:]) })
			h := rapid.SampledFrom(hs).Draw(t, "pending")
			return h, pending[h], true
		}
		draw := func(t *rapid.T) [16]byte {
			return testHash(rapid.IntRange(0, pool-1).Draw(t, "key"), rapid.Bool().Draw(t, "clustered"))
		}
		t.Repeat(map[string]func(*rapid.T){
			"add": func(t *rapid.T) {
				seg := rapid.IntRange(0, segs-1).Draw(t, "seg")
				for range rapid.IntRange(1, 400).Draw(t, "n") {
					h := draw(t)
					e := entry{seg: uint32(seg), hdrLen: uint32(rapid.SampledFrom([]int{sector, block}).Draw(t, "hdr")),
						off: int64(rapid.IntRange(0, 1<<30).Draw(t, "off")) * sector, size: rapid.Int64Range(1, maxData).Draw(t, "size"),
						format: rapid.Uint64().Draw(t, "format"), pending: rapid.Bool().Draw(t, "pending")}
					i, old, replaced, err := x.add(&heads[seg], h, e)
					if err != nil {
						t.Fatal(err)
					}
					want, had := model[h]
					if replaced != had || replaced && old != want {
						t.Fatalf("add %x: replaced %v %+v, want %v %+v", h, replaced, old, had, want)
					}
					model[h] = e
					delete(pending, h)
					if e.pending {
						pending[h] = i
					}
					// Any other hash, in the old table or the new one while
					// the table grows.
					o := draw(t)
					got, ok := x.get(o)
					if want, had := model[o]; ok != had || ok && got != want {
						t.Fatalf("get %x during adds: %v %+v, want %v %+v", o, ok, got, had, want)
					}
				}
			},
			"remove": func(t *rapid.T) {
				h := draw(t)
				if _, ok := pending[h]; ok {
					return // the store aborts pending entries instead
				}
				e, ok := x.remove(h)
				want, had := model[h]
				if ok != had || ok && e != want {
					t.Fatalf("remove %x: %v %+v, want %v %+v", h, ok, e, had, want)
				}
				delete(model, h)
			},
			"commit": func(t *rapid.T) {
				h, i, ok := anyPending(t)
				if !ok {
					t.Skip("nothing pending")
				}
				if !x.isPending(i) {
					t.Fatalf("record %d of %x is not pending", i, h)
				}
				x.commit(i)
				e := model[h]
				e.pending = false
				model[h] = e
				delete(pending, h)
			},
			"abort": func(t *rapid.T) {
				h, i, ok := anyPending(t)
				if !ok {
					t.Skip("nothing pending")
				}
				x.abort(i)
				if x.isPending(i) {
					t.Fatalf("record %d of %x is pending after its abort", i, h)
				}
				delete(model, h)
				delete(pending, h)
			},
			"live": func(t *rapid.T) {
				seg := rapid.IntRange(0, segs-1).Draw(t, "seg")
				batch := rapid.IntRange(1, 50).Draw(t, "batch")
				got := map[[16]byte]entry{}
				for from := heads[seg]; from != 0; {
					n := 0
					from = x.live(from, batch, func(_ uint32, h [16]byte, e entry) {
						got[h] = e
						n++
					})
					if n > batch {
						t.Fatalf("a listing of %d gave %d", batch, n)
					}
				}
				for h, e := range model {
					if e.seg == uint32(seg) {
						if g, ok := got[h]; !ok || g != e {
							t.Fatalf("listing of segment %d: %x %v %+v, want %+v", seg, h, ok, g, e)
						}
						delete(got, h)
					}
				}
				if len(got) != 0 {
					t.Fatalf("listing of segment %d: %d records not in the model", seg, len(got))
				}
			},
			"drop": func(t *rapid.T) {
				seg := rapid.IntRange(0, segs-1).Draw(t, "seg")
				var objects, bytes int64
				for h, e := range model {
					if e.seg == uint32(seg) {
						objects++
						bytes += e.size
						delete(model, h)
						delete(pending, h)
					}
				}
				n, b := x.dropSegment(heads[seg])
				heads[seg] = 0
				if n != objects || b != bytes {
					t.Fatalf("drop of segment %d: %d objects of %d bytes, want %d of %d", seg, n, b, objects, bytes)
				}
			},
			"": func(t *rapid.T) {
				if x.n != len(model) || x.tab.Len() != len(model) || x.tab.Len()*4 > x.tab.Slots()*3 {
					t.Fatalf("index counts %d (table %d in %d slots), model %d", x.n, x.tab.Len(), x.tab.Slots(), len(model))
				}
				for i := range pool {
					for _, c := range []bool{false, true} {
						h := testHash(i, c)
						e, ok := x.get(h)
						if want, had := model[h]; ok != had || ok && e != want {
							t.Fatalf("get %x: %v %+v, want %v %+v", h, ok, e, had, want)
						}
					}
				}
			},
		})
	})
}

// A segment dropped after its object was removed and stored again in a later
// segment (live, and again after a restart, where the later record overrides
// the earlier) takes only its own objects with it.
func TestDropKeepsLaterRecord(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.CapacityBytes = 1 << 20 // segments of 128 KiB
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restart=%v", restart), func(t *testing.T) {
			cfg.Dir = t.TempDir()
			s := open(t, cfg)
			put(t, s, "k", data(20_000, 1))
			put(t, s, "other", data(20_000, 2))
			if had, err := s.RemoveObject(bg, "k"); !had || err != nil {
				t.Fatalf("remove: %v %v", had, err)
			}
			s.flush()
			first := s.Stats().Files
			// Fill the first segment, so that k's next record is in another.
			for i := 0; s.Stats().Files == first; i++ {
				put(t, s, fmt.Sprintf("fill%d", i), data(20_000, 100+i))
			}
			put(t, s, "k", data(30_000, 3))
			s.flush()
			if restart {
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				s = open(t, cfg)
			}
			s.mu.Lock()
			dropped := s.dropOldestLocked()
			s.mu.Unlock()
			if !dropped {
				t.Fatal("the oldest segment was not dropped")
			}
			mustGet(t, s, "k", data(30_000, 3))
			mustMiss(t, s, "other", 20_000)
			if st := s.Stats(); st.Objects == 0 || st.LiveBytes <= 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}
