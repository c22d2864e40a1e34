package arena

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// The reference model of an arena: every object it ever held, what state it is
// in, its leases and its recency. Background eviction is off (high watermark 1),
// so the only evictions are Reserve's. The model predicts the first lruVictims of
// them exactly (least recently used first); the region eviction after them
// depends on where objects lie, so for those it checks that each victim could be
// evicted at its turn, and that a Reserve fails only when nothing is left to
// evict and no free extent fits.

type modelObject struct {
	id      int
	key     string
	format  uint64
	size    int
	span    int64
	state   state // pending, committed, gone (removed but leased), freed
	leases  int
	recency int // the tick of its Commit or its last lease's end
	pending *Pending
	doomed  bool // pending and removed: its Commit drops it
}

type modelLease struct {
	l   *Lease
	obj *modelObject
}

type arenaModel struct {
	a       *Arena
	unit    int64
	keys    []string
	objs    map[int]*modelObject
	index   map[string]*modelObject
	leases  []modelLease
	victims []Evicted // OnEvict's log, copied
	spill   bool      // what OnEvict returns
	tick    int
	nextID  int
	evicted int64
	slab    int64 // Config.SlabBytes
	size    int64 // the arena's bytes
	batches []modelBatch
}

// modelBatch is one ReserveInto's Pendings and the objects they hold (nil
// where it reserved nothing).
type modelBatch struct {
	ps   []Pending
	objs []*modelObject
}

// span is what an object of size bytes under key holds: a slot of its size class
// (slab.go), or an extent of its own and a descriptor slot; and fresh, room in
// a free extent with which its Reserve cannot fail (a new slab, or its extent
// and a new slab for its descriptor).
func (m *arenaModel) span(size int, key string) (span, fresh int64) {
	slabOf := func(c int) int64 { return (max(m.slab, 4*classes[c]) + m.unit - 1) / m.unit * m.unit }
	if c := classOf(int64(size + len(key) + trailerBytes)); size < int(m.unit) && c >= 0 {
		if slab := slabOf(c); slab <= m.size {
			return classes[c], slab
		}
	}
	d := classOf(int64(len(key) + descBytes))
	desc := slabOf(d)
	if desc > m.size {
		desc = (classes[d] + m.unit - 1) / m.unit * m.unit
	}
	ext := (int64(size) + m.unit - 1) / m.unit * m.unit
	return ext + classes[d], ext + desc
}

// data is the content of object id: ids are unique, so a stale read shows.
func (m *arenaModel) data(o *modelObject) []byte { return pattern(fmt.Sprint(o.id), o.size) }

func (m *arenaModel) used() int64 {
	var n int64
	for _, o := range m.objs {
		if o.state != freed {
			n += o.span
		}
	}
	return n
}

func (m *arenaModel) pendings() []*modelObject {
	var out []*modelObject
	for _, id := range slices.Sorted(maps.Keys(m.objs)) {
		if o := m.objs[id]; o.state == pending {
			out = append(out, o)
		}
	}
	return out
}

// evictable is the committed, unleased objects, least recent first.
func (m *arenaModel) evictable() []*modelObject {
	var out []*modelObject
	for _, o := range m.index {
		if o.state == committed && o.leases == 0 {
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(a, b *modelObject) int { return a.recency - b.recency })
	return out
}

func (m *arenaModel) reserve(t *rapid.T) {
	key := rapid.SampledFrom(m.keys).Draw(t, "key")
	format := uint64(rapid.IntRange(1, 2).Draw(t, "format"))
	size := rapid.OneOf(rapid.IntRange(1, int(m.unit)-1), rapid.IntRange(1, 8*int(m.unit))).Draw(t, "size")
	span, fresh := m.span(size, key)
	m.victims = m.victims[:0]
	p, err := m.a.Reserve(key, format, int64(size))
	if old := m.index[key]; old != nil {
		if !errors.Is(err, ErrExists) || errors.Is(err, ErrFormat) != (old.format != format) {
			t.Fatalf("reserve of existing %s (format %d, now %d): %v", key, old.format, format, err)
		}
		if len(m.victims) > 0 {
			t.Fatalf("a reserve of an existing key evicted %d objects", len(m.victims))
		}
		return
	}
	// The first victims must each be the least recently used evictable object at
	// its turn, the rest evictable.
	for i, v := range m.victims {
		cand := m.evictable()
		j := slices.IndexFunc(cand, func(o *modelObject) bool { return o.key == v.Key })
		if j < 0 || i < lruVictims && j != 0 {
			t.Fatalf("victim %d is %s; the evictable objects, least recently used first, are %v", i, v.Key, cand)
		}
		o := cand[j]
		if v.Format != o.format || !bytes.Equal(v.Bytes, m.data(o)) {
			t.Fatalf("OnEvict(%s) saw format %d and other bytes than were written", v.Key, v.Format)
		}
		delete(m.index, o.key)
		o.state = freed
		m.evicted++
	}
	if errors.Is(err, ErrNoSpace) {
		if left := m.evictable(); len(left) > 0 {
			t.Fatalf("no space with %d evictable objects left", len(left))
		}
		if st := m.a.Stats(); st.LargestFreeExtent >= fresh {
			t.Fatalf("no space for %d bytes with a free extent of %d", fresh, st.LargestFreeExtent)
		}
		return
	}
	if err != nil {
		t.Fatalf("reserve %s: %v", key, err)
	}
	m.nextID++
	o := &modelObject{id: m.nextID, key: key, format: format, size: size, span: span, state: pending, pending: p}
	m.objs[o.id], m.index[key] = o, o
	if len(p.Bytes()) != size {
		t.Fatalf("reserved %d bytes, want %d", len(p.Bytes()), size)
	}
	copy(p.Bytes(), m.data(o))
}

// reserveBatch reserves up to four objects with one ReserveInto: each as
// Reserve would, except that it evicts nothing, and answers ErrNotNow only
// when no free extent would have held the object.
func (m *arenaModel) reserveBatch(t *rapid.T) {
	n := rapid.IntRange(1, 4).Draw(t, "n")
	keys, formats, sizes := make([]string, n), make([]uint64, n), make([]int64, n)
	for i := range n {
		keys[i] = rapid.SampledFrom(m.keys).Draw(t, "key")
		formats[i] = uint64(rapid.IntRange(1, 2).Draw(t, "format"))
		sizes[i] = int64(rapid.OneOf(rapid.IntRange(1, int(m.unit)-1), rapid.IntRange(1, 8*int(m.unit))).Draw(t, "size"))
	}
	b := modelBatch{ps: make([]Pending, n), objs: make([]*modelObject, n)}
	errs := make([]error, n)
	m.victims = m.victims[:0]
	// Until the warm-up ends it hands out memory meanwhile: the free space
	// after the call says nothing about what was free during it.
	warm := false
	select {
	case <-m.a.Ready():
		warm = true
	default:
	}
	if err := m.a.ReserveInto(keys, formats, sizes, b.ps, errs); err != nil {
		t.Fatal(err)
	}
	if len(m.victims) > 0 {
		t.Fatalf("ReserveInto evicted %d objects", len(m.victims))
	}
	largest := m.a.Stats().LargestFreeExtent // free space only shrank during the call
	for i, key := range keys {
		err := errs[i]
		if old := m.index[key]; old != nil {
			if !errors.Is(err, ErrExists) || errors.Is(err, ErrFormat) != (old.format != formats[i]) {
				t.Fatalf("ReserveInto of existing %s (format %d, now %d): %v", key, old.format, formats[i], err)
			}
			continue
		}
		span, fresh := m.span(int(sizes[i]), key)
		if errors.Is(err, ErrNotNow) {
			if warm && largest >= fresh {
				t.Fatalf("ReserveInto: no room now for %s (%d bytes) with a free extent of %d", key, fresh, largest)
			}
			continue
		}
		if err != nil {
			t.Fatalf("ReserveInto %s: %v", key, err)
		}
		m.nextID++
		o := &modelObject{id: m.nextID, key: key, format: formats[i], size: int(sizes[i]), span: span, state: pending, pending: &b.ps[i]}
		m.objs[o.id], m.index[key] = o, o
		b.objs[i] = o
		if len(b.ps[i].Bytes()) != o.size {
			t.Fatalf("ReserveInto gave %d bytes, want %d", len(b.ps[i].Bytes()), o.size)
		}
		copy(b.ps[i].Bytes(), m.data(o))
	}
	m.batches = append(m.batches, b)
}

// commitAll commits a batch's Pendings with one CommitAll: those still
// pending as a Commit of each would, the others ErrDone.
func (m *arenaModel) commitAll(t *rapid.T) {
	if len(m.batches) == 0 {
		t.Skip("no batch")
	}
	k := rapid.IntRange(0, len(m.batches)-1).Draw(t, "batch")
	b := m.batches[k]
	m.batches = slices.Delete(m.batches, k, k+1)
	errs := make([]error, len(b.ps))
	if err := m.a.CommitAll(b.ps, errs); err != nil {
		t.Fatal(err)
	}
	for i, o := range b.objs {
		switch {
		case o == nil || o.state != pending:
			if !errors.Is(errs[i], ErrDone) {
				t.Fatalf("CommitAll of an element that holds nothing or ended: %v, want ErrDone", errs[i])
			}
		case o.doomed:
			if !errors.Is(errs[i], ErrRemoved) {
				t.Fatalf("CommitAll of %s, removed while pending: %v, want ErrRemoved", o.key, errs[i])
			}
			o.state = freed
			delete(m.index, o.key)
		default:
			if errs[i] != nil {
				t.Fatalf("CommitAll of %s: %v", o.key, errs[i])
			}
			o.state, o.recency = committed, m.tick
			m.tick++
		}
	}
}

func (m *arenaModel) commit(t *rapid.T) {
	ps := m.pendings()
	if len(ps) == 0 {
		t.Skip("no pending write")
	}
	o := rapid.SampledFrom(ps).Draw(t, "pending")
	err := o.pending.Commit()
	if o.doomed {
		if !errors.Is(err, ErrRemoved) {
			t.Fatalf("commit of %s, removed while pending: %v, want ErrRemoved", o.key, err)
		}
		o.state = freed
		delete(m.index, o.key)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	o.state, o.recency = committed, m.tick
	m.tick++
}

func (m *arenaModel) abort(t *rapid.T) {
	ps := m.pendings()
	if len(ps) == 0 {
		t.Skip("no pending write")
	}
	o := rapid.SampledFrom(ps).Draw(t, "pending")
	o.pending.Abort()
	o.state = freed
	delete(m.index, o.key)
}

func (m *arenaModel) acquire(t *rapid.T) {
	key := rapid.SampledFrom(m.keys).Draw(t, "key")
	format := uint64(rapid.IntRange(1, 2).Draw(t, "format"))
	l, err := m.a.Acquire(key, format)
	o := m.index[key]
	switch {
	case o == nil || o.state == pending:
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("acquire of %s, absent or pending: %v", key, err)
		}
	case o.format != format:
		if !errors.Is(err, ErrFormat) {
			t.Fatalf("acquire of %s in format %d, stored in %d: %v", key, format, o.format, err)
		}
	default:
		if err != nil {
			t.Fatalf("acquire %s: %v", key, err)
		}
		if !bytes.Equal(l.Bytes(), m.data(o)) {
			t.Fatalf("%s: read other bytes than were written", key)
		}
		o.leases++
		m.leases = append(m.leases, modelLease{l, o})
	}
}

func (m *arenaModel) release(t *rapid.T) {
	if len(m.leases) == 0 {
		t.Skip("no lease")
	}
	i := rapid.IntRange(0, len(m.leases)-1).Draw(t, "lease")
	ml := m.leases[i]
	m.leases = slices.Delete(m.leases, i, i+1)
	ml.l.Release()
	o := ml.obj
	if o.leases--; o.leases == 0 {
		if o.state == gone {
			o.state = freed
		} else {
			o.recency = m.tick
			m.tick++
		}
	}
}

func (m *arenaModel) remove(t *rapid.T) {
	key := rapid.SampledFrom(m.keys).Draw(t, "key")
	o := m.index[key]
	want := o != nil && (o.state == committed || o.state == pending)
	if got := m.a.Remove(key); got != want {
		t.Fatalf("remove %s: %v, want %v", key, got, want)
	}
	if want && o.state == pending {
		o.doomed = true // still indexed until its Commit or Abort
		return
	}
	if want {
		delete(m.index, key)
		o.state = gone
		if o.leases == 0 {
			o.state = freed
		}
	}
}

func (m *arenaModel) contains(t *rapid.T) {
	key := rapid.SampledFrom(m.keys).Draw(t, "key")
	format := uint64(rapid.IntRange(1, 2).Draw(t, "format"))
	o := m.index[key]
	want := o != nil && o.state == committed && o.format == format
	if got := m.a.Contains(key, format); got != want {
		t.Fatalf("contains %s/%d: %v, want %v", key, format, got, want)
	}
}

func (m *arenaModel) check(t *rapid.T) {
	if err := m.a.Check(); err != nil {
		t.Fatal(err)
	}
	var committedN, pendingN, leasedN int64
	for _, o := range m.objs {
		switch o.state {
		case committed:
			committedN++
		case pending:
			pendingN++
		}
		if o.leases > 0 {
			leasedN++
		}
	}
	st := m.a.Stats()
	if st.HeldBytes != m.used() || st.UsedBytes < st.HeldBytes || st.Objects != committedN || st.PendingObjects != pendingN ||
		st.LeasedObjects != leasedN || st.Leases != int64(len(m.leases)) || st.Evictions != m.evicted {
		t.Fatalf("stats %+v; model: held %d, %d committed, %d pending, %d leased by %d leases, %d evicted",
			st, m.used(), committedN, pendingN, leasedN, len(m.leases), m.evicted)
	}
	if m.spill && st.Spilled != m.evicted || !m.spill && st.Dropped != m.evicted {
		t.Fatalf("spilled %d, dropped %d of %d evictions (OnEvict returns %v)", st.Spilled, st.Dropped, m.evicted, m.spill)
	}
	// Leased bytes are never overwritten, even when their object was removed.
	for _, ml := range m.leases {
		if !bytes.Equal(ml.l.Bytes(), m.data(ml.obj)) {
			t.Fatalf("leased %s changed under its lease", ml.obj.key)
		}
	}
}

func TestArenaModel(t *testing.T) {
	al := testAllocator(t)
	rapid.Check(t, func(t *rapid.T) {
		const unit = 64
		cfg := DefaultConfig(unit * int64(rapid.IntRange(8, 48).Draw(t, "units")))
		cfg.Allocator, cfg.Logger = al, slog.New(slog.DiscardHandler)
		cfg.Alignment = unit
		cfg.SlabBytes = int64(rapid.SampledFrom([]int{64, 128, 256}).Draw(t, "slab"))
		cfg.HighWatermark, cfg.LowWatermark = 1, 0.99 // eviction only by Reserve
		m := &arenaModel{
			unit: unit,
			// Short keys, and long ones that take large descriptor slots or
			// push a small object out of the slabs.
			keys:  []string{"a", "b", "c", "d", "e", "f", "g", "h", strings.Repeat("i", 61), strings.Repeat("j", 130)},
			slab:  cfg.SlabBytes,
			size:  cfg.SizeBytes,
			objs:  map[int]*modelObject{},
			index: map[string]*modelObject{},
			spill: rapid.Bool().Draw(t, "spill"),
		}
		cfg.OnEvict = func(e Evicted) bool {
			e.Bytes = bytes.Clone(e.Bytes)
			m.victims = append(m.victims, e)
			return m.spill
		}
		a, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		m.a = a
		t.Repeat(map[string]func(*rapid.T){
			"reserve":   m.reserve,
			"commit":    m.commit,
			"batch":     m.reserveBatch,
			"commitAll": m.commitAll,
			"abort":     m.abort,
			"acquire":   m.acquire,
			"release":   m.release,
			"remove":    m.remove,
			"contains":  m.contains,
			"":          m.check,
		})
		// Ending every lease and write leaves exactly the committed objects.
		for len(m.leases) > 0 {
			m.leases[0].l.Release()
			m.leases[0].obj.leases--
			if o := m.leases[0].obj; o.leases == 0 && o.state == gone {
				o.state = freed
			}
			m.leases = m.leases[1:]
		}
		for _, o := range m.pendings() {
			o.pending.Abort()
			o.state = freed
			delete(m.index, o.key)
		}
		m.check(t)
		var want int64
		for _, o := range m.index {
			want += o.span
		}
		if st := a.Stats(); st.HeldBytes != want || st.PendingBytes != 0 || st.LeasedObjects != 0 {
			t.Fatalf("after ending every lease and write: %+v, want %d bytes used", st, want)
		}
		// Removing every object leaves an empty allocator: no slab outlives its objects.
		for key := range m.index {
			a.Remove(key)
		}
		if st := a.Stats(); st.UsedBytes != 0 || st.Slabs != 0 || st.HeldBytes != 0 {
			t.Fatalf("after removing every object: %+v", st)
		}
	})
}

func (o *modelObject) String() string { return fmt.Sprintf("%s#%d", o.key, o.id) }
