package arena

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The index: what the arena knows about each object, kept off the Go heap.
//
// Every object is a fixed-size, pointer-free record (48 bytes) in memory mapped
// outside the Go heap, chunk by chunk, addressed by a uint32 record index; keys
// are found through an open-addressing hash table of record indexes, also mapped.
// The garbage collector never scans either, so holding 100M objects costs a
// collection nothing, and the metadata of an object is its record and its hash
// table slot (8 bytes at a load of 3/8 to 3/4) whatever its key's length. The key
// itself lies in the arena beside the object's bytes (small objects) or in key
// blocks of the index (objects in extents of their own, whose bytes fill their
// extent to the alignment), and lookups compare the real key bytes, so a hash
// collision never serves a foreign object.

// record is one object's metadata. Its size is part of the arena's memory budget:
// keep it at 48 bytes.
type record struct {
	hash   uint64 // hash of the key
	format uint64
	off    int64 // byte offset of the object's bytes in the region
	size   int64 // the object's bytes
	// prev and next link the LRU list (record 0 is its sentinel).
	prev, next uint32
	// ref is, for an object in a slab, 1 + the slab's id, its key lying right after
	// its bytes; for an object in an extent of its own, 1 + the first key block.
	ref    uint32
	keyLen uint16
	state  state
	flags  uint8
}

const (
	flagSlab     = 1 << iota // the object lies in a slab (ref is a slab), not in an extent of its own
	flagEvicting             // OnEvict runs on it now: its bytes must stay
	flagTouched              // acquired while evicting: recently used after all
	flagInLRU                // on the LRU list
)

// keyBlock holds keyBlockData bytes of a key and links to the next block.
type keyBlock struct {
	data [keyBlockData]byte
	next uint32 // 1 + the next block, 0 at the last
}

const keyBlockData = 60

// chunkShift sets the elements per mapped chunk of a pool: 64 Ki, so 3 MiB of
// records.
const chunkShift = 16

// pool hands out fixed-size, pointer-free elements from chunks of memory mapped
// outside the Go heap, addressed by uint32 indexes that stay valid until the pool
// is closed (chunks never move). Freed indexes are reused first.
type pool[T any] struct {
	chunks [][]T    // each a mapped chunk of 1<<chunkShift elements
	n      uint32   // indexes handed out so far, freed ones included
	free   []uint32 // freed indexes: a pointer-free slice the GC does not scan
	live   int
}

func (p *pool[T]) get(i uint32) *T { return &p.chunks[i>>chunkShift][i&(1<<chunkShift-1)] }

// alloc returns a zeroed element's index.
func (p *pool[T]) alloc() (uint32, error) {
	var i uint32
	if k := len(p.free); k > 0 {
		i = p.free[k-1]
		p.free = p.free[:k-1]
	} else {
		if p.n == 1<<32-1 {
			return 0, fmt.Errorf("arena index holds %d entries, its limit: %w", p.n, ErrNoSpace)
		}
		if int(p.n>>chunkShift) == len(p.chunks) {
			var zero T
			mem, err := mapAnon(int(unsafe.Sizeof(zero)) << chunkShift)
			if err != nil {
				return 0, err
			}
			p.chunks = append(p.chunks, unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(mem))), 1<<chunkShift))
		}
		i = p.n
		p.n++
	}
	p.live++
	var zero T
	*p.get(i) = zero
	return i, nil
}

func (p *pool[T]) release(i uint32) {
	p.free = append(p.free, i)
	p.live--
}

// bytes is the memory the pool has mapped.
func (p *pool[T]) bytes() int64 {
	var zero T
	return int64(len(p.chunks)) << chunkShift * int64(unsafe.Sizeof(zero))
}

func (p *pool[T]) close() {
	var zero T
	for _, c := range p.chunks {
		unmapAnon(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(c))), len(c)*int(unsafe.Sizeof(zero))))
	}
	*p = pool[T]{}
}

// table is an open-addressing hash table (linear probing, deletion by backward
// shift, no tombstones) of record indexes in mapped memory. A slot holds the
// record index in its low 32 bits and the low 32 bits of the key's hash in its
// high ones, so probing and growing never touch the records, and 0 is an empty
// slot (record 0 is the LRU sentinel, never indexed).
//
// It grows by doubling, incrementally: rehashing 100M entries at once would hold
// the arena's lock for seconds. The grown table takes every insert while each
// insert and remove also moves migrateStep slots of the old one across; until the
// old one is empty, lookups probe both. In the old table a moved or removed entry
// leaves a tombstone (index 0, hash bits 1): a backward shift there could move a
// waiting entry behind the migration cursor, and a plain empty slot would cut the
// probe runs of the entries still waiting.
type table struct {
	slots   []uint64
	mask    uint64
	n       int      // entries in both tables
	old     []uint64 // the table being migrated from, nil when none
	oldMask uint64
	cursor  int // old slots before it have been moved
}

const (
	tableMinSlots = 1024
	// migrateStep is the old slots each insert or remove moves: the old table
	// is empty long before the new one needs to grow (it has taken 3/4 of the
	// old one's slots in inserts by then).
	migrateStep = 16
	tombstone   = 1 << 32
)

func newTable(slots int) (table, error) {
	s, err := mapSlots(slots)
	if err != nil {
		return table{}, err
	}
	return table{slots: s, mask: uint64(slots - 1)}, nil
}

func mapSlots(n int) ([]uint64, error) {
	mem, err := mapAnon(n * 8)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(mem))), n), nil
}

func unmapSlots(s []uint64) {
	if s != nil {
		unmapAnon(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*8))
	}
}

func (t *table) close() {
	unmapSlots(t.slots)
	unmapSlots(t.old)
	*t = table{}
}

func slotOf(idx uint32, hash uint64) uint64 { return uint64(idx) | hash<<32 }

// insert adds idx under hash, starting to grow the table past a load of 3/4.
func (t *table) insert(idx uint32, hash uint64) error {
	if (t.n+1)*4 > len(t.slots)*3 {
		for t.old != nil { // never in practice: see migrateStep
			t.migrate()
		}
		bigger, err := mapSlots(len(t.slots) * 2)
		if err != nil {
			return err
		}
		t.old, t.oldMask, t.cursor = t.slots, t.mask, 0
		t.slots, t.mask = bigger, uint64(len(bigger)-1)
	}
	t.migrate()
	t.put(slotOf(idx, hash))
	t.n++
	return nil
}

// migrate moves the next migrateStep slots of the old table into the new one,
// and drops the old one once it is empty.
func (t *table) migrate() {
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
		unmapSlots(t.old)
		t.old, t.oldMask, t.cursor = nil, 0, 0
	}
}

func (t *table) put(s uint64) {
	i := s >> 32 & t.mask
	for t.slots[i] != 0 {
		i = (i + 1) & t.mask
	}
	t.slots[i] = s
}

// find is the position of idx, indexed under hash, in the new table (old false)
// or the old one; -1 when it is in neither.
func (t *table) find(idx uint32, hash uint64) (pos int, old bool) {
	for i := hash & t.mask; t.slots[i] != 0; i = (i + 1) & t.mask {
		if uint32(t.slots[i]) == idx {
			return int(i), false
		}
	}
	if t.old != nil {
		for i := hash & t.oldMask; t.old[i] != 0; i = (i + 1) & t.oldMask {
			if uint32(t.old[i]) == idx {
				return int(i), true
			}
		}
	}
	return -1, false
}

// remove takes idx, indexed under hash, out of the table.
func (t *table) remove(idx uint32, hash uint64) {
	pos, old := t.find(idx, hash)
	switch {
	case pos < 0:
		panic(fmt.Sprintf("arena: record %d is not in the index", idx)) // a bookkeeping bug
	case old:
		t.old[pos] = tombstone
	default:
		// Backward shift: move each later entry of the run into the hole unless
		// its home slot lies cyclically in (hole, its slot].
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

// entries calls fn for every slot in use, in either table.
func (t *table) entries(fn func(s uint64)) {
	for _, s := range t.slots {
		if s != 0 {
			fn(s)
		}
	}
	for _, s := range t.old {
		if uint32(s) != 0 {
			fn(s)
		}
	}
}

// bytes is the memory the table has mapped.
func (t *table) bytes() int64 { return int64(len(t.slots)+len(t.old)) * 8 }

func mapAnon(n int) ([]byte, error) {
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(n), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("arena: map %d bytes for the index: %v; the host is out of address space or memory: %w", n, err, ErrNoSpace)
	}
	return unsafe.Slice((*byte)(p), n), nil
}

func unmapAnon(b []byte) {
	if len(b) > 0 {
		_ = unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)))
	}
}
