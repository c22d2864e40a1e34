package offheap

import "fmt"

// Table is an open-addressing hash table (linear probing, deletion by
// backward shift) of uint32 indexes, such as a Pool's, in memory mapped
// outside the Go heap. A slot holds the index in its low 32 bits and 32 bits
// of the entry's hash, its hash bits, in its high ones, so that probing and
// growing never touch what the indexes name; only an index whose hash bits
// match is handed to the caller's predicate (Find), which compares the real
// key. Index 0 is never stored: a 0 slot is empty, so Pool users keep element
// 0 for a sentinel or leave it unused.
//
// It grows by doubling past a load of 3/4, incrementally: rehashing 100M
// entries at once would hold the caller's lock for seconds. The grown table
// takes every insert while each Insert and Remove also moves migrateStep slots
// of the old one across; until the old one is empty, lookups probe both. In
// the old table a moved or removed entry leaves a tombstone (index 0, hash bits
// 1): a backward shift there could move a waiting entry behind the migration
// cursor, and a plain empty slot would cut the probe runs of the entries still
// waiting. A slot costs 8 bytes, 11 to 21 an entry at a load of 3/8 to 3/4.
//
// Make one with NewTable; the zero Table is closed.
type Table struct {
	slots   []uint64
	mask    uint64
	n       int      // entries in both tables
	old     []uint64 // the table being migrated from, nil when none
	oldMask uint64
	cursor  int // old slots before it have been moved
}

const (
	minSlots = 1024
	// migrateStep is the old slots each insert or remove moves: the old table
	// is empty long before the new one needs to grow (it has taken 3/4 of the
	// old one's slots in inserts by then).
	migrateStep = 16
	tombstone   = 1 << 32
)

// NewTable returns an empty table of 1024 slots (8 KiB). It fails with ErrMap.
func NewTable() (Table, error) {
	s, err := mapSlice[uint64](minSlots)
	if err != nil {
		return Table{}, err
	}
	return Table{slots: s, mask: minSlots - 1}, nil
}

// Presize makes an empty table hold n entries without growing, at a load of
// at most 3/4: for a caller that is about to insert that many (rebuilding an
// index), every insert and lookup then probes one table, never a migration.
// It does nothing to a table that holds entries or is large enough. It fails
// with ErrMap, leaving the table as it was.
func (t *Table) Presize(n int) error {
	want := minSlots
	for want*3 < n*4 {
		want *= 2
	}
	if t.n > 0 || t.old != nil || want <= len(t.slots) {
		return nil
	}
	s, err := mapSlice[uint64](want)
	if err != nil {
		return err
	}
	unmapSlice(t.slots)
	t.slots, t.mask = s, uint64(want-1)
	return nil
}

// Close unmaps the table's memory; the table is closed, as a zero Table.
func (t *Table) Close() {
	unmapSlice(t.slots)
	unmapSlice(t.old)
	*t = Table{}
}

func slotOf(idx, bits uint32) uint64 { return uint64(idx) | uint64(bits)<<32 }

// Insert adds idx under hash bits, starting to grow the table past a load of
// 3/4. idx must not be 0 nor in the table already. It fails with ErrMap when
// the grown table cannot be mapped, leaving the table as it was.
func (t *Table) Insert(idx, bits uint32) error {
	if idx == 0 {
		panic("offheap: index 0 inserted into a table") // a bug of the caller: 0 marks an empty slot
	}
	if (t.n+1)*4 > len(t.slots)*3 {
		for t.old != nil { // never in practice: see migrateStep
			t.migrate()
		}
		bigger, err := mapSlice[uint64](len(t.slots) * 2)
		if err != nil {
			return err
		}
		t.old, t.oldMask, t.cursor = t.slots, t.mask, 0
		t.slots, t.mask = bigger, uint64(len(bigger)-1)
	}
	t.migrate()
	t.put(slotOf(idx, bits))
	t.n++
	return nil
}

// migrate moves the next migrateStep slots of the old table into the new one,
// and drops the old one once it is empty.
func (t *Table) migrate() {
	if t.old == nil {
		return
	}
	for end := min(t.cursor+migrateStep, len(t.old)); t.cursor < end; t.cursor++ {
		if s := t.old[t.cursor]; uint32(s) != 0 {
			t.put(s)
			t.old[t.cursor] = tombstone
		}
	}
	if t.cursor == len(t.old) {
		unmapSlice(t.old)
		t.old, t.oldMask, t.cursor = nil, 0, 0
	}
}

func (t *Table) put(s uint64) {
	i := s >> 32 & t.mask
	for t.slots[i] != 0 {
		i = (i + 1) & t.mask
	}
	t.slots[i] = s
}

// Find returns the first index under hash bits for which match holds, 0 when
// none does. match sees only indexes whose hash bits are bits, so it is
// called about once a lookup; it compares what the bits cannot tell apart
// (the full hash, the key).
func (t *Table) Find(bits uint32, match func(idx uint32) bool) uint32 {
	b := uint64(bits)
	for i := b & t.mask; ; i = (i + 1) & t.mask {
		s := t.slots[i]
		if s == 0 {
			break
		}
		if s>>32 == b && match(uint32(s)) {
			return uint32(s)
		}
	}
	if t.old != nil {
		for i := b & t.oldMask; ; i = (i + 1) & t.oldMask {
			s := t.old[i]
			if s == 0 {
				break
			}
			if s>>32 == b && uint32(s) != 0 && match(uint32(s)) { // index 0: a tombstone
				return uint32(s)
			}
		}
	}
	return 0
}

// Touch reads the slot a lookup under hash bits starts at, and returns it: a
// caller about to look up many keys touches all their slots first, and the
// cache misses of those independent loads overlap instead of coming one
// lookup at a time.
func (t *Table) Touch(bits uint32) uint64 { return t.slots[uint64(bits)&t.mask] }

// probeFor is the position of slot value s in slots, -1 when it is not in
// the probe run from its home.
func probeFor(slots []uint64, mask, s uint64) int {
	for i := s >> 32 & mask; slots[i] != 0; i = (i + 1) & mask {
		if slots[i] == s {
			return int(i)
		}
	}
	return -1
}

// Remove takes idx, inserted under hash bits, out of the table. It panics when
// idx is not there under bits: the caller's bookkeeping is wrong.
func (t *Table) Remove(idx, bits uint32) {
	s := slotOf(idx, bits)
	pos, old := probeFor(t.slots, t.mask, s), false
	if pos < 0 && t.old != nil {
		pos, old = probeFor(t.old, t.oldMask, s), true
	}
	switch {
	case pos < 0:
		panic(fmt.Sprintf("offheap: index %d (hash bits %#x) is not in the table", idx, bits)) // a bookkeeping bug
	case old:
		t.old[pos] = tombstone
	default:
		// Backward shift: move each later entry of the run into the hole
		// unless its home slot lies cyclically in (hole, its slot].
		i := uint64(pos)
		for j := (i + 1) & t.mask; t.slots[j] != 0; j = (j + 1) & t.mask {
			home := t.slots[j] >> 32 & t.mask
			if (j-home)&t.mask >= (j-i)&t.mask {
				t.slots[i] = t.slots[j]
				i = j
			}
		}
		t.slots[i] = 0
	}
	t.n--
	t.migrate()
}

// Entries calls fn with every entry's index and hash bits, in no order. fn
// must not change the table.
func (t *Table) Entries(fn func(idx, bits uint32)) {
	for _, s := range t.slots {
		if s != 0 {
			fn(uint32(s), uint32(s>>32))
		}
	}
	for _, s := range t.old {
		if uint32(s) != 0 {
			fn(uint32(s), uint32(s>>32))
		}
	}
}

// Len is the entries in the table.
func (t *Table) Len() int { return t.n }

// Slots is the slots of the table that takes inserts: the table stays under
// a load of 3/4, Len()*4 <= Slots()*3.
func (t *Table) Slots() int { return len(t.slots) }

// Bytes is the memory the table has mapped, the table being migrated from
// included.
func (t *Table) Bytes() int64 { return int64(len(t.slots)+len(t.old)) * 8 }
