package arena

import "fmt"

// The index: what the arena knows about each object, kept off the Go heap.
//
// Every object is a fixed-size, pointer-free record (48 bytes) in an
// offheap.Pool, memory mapped outside the Go heap and addressed by a uint32
// record index; keys are found through an offheap.Table of record indexes
// under the low 32 bits of their key's hash, also mapped. The garbage
// collector never scans either, so holding 100M objects costs a collection
// nothing, and the metadata of an object is its record and its hash table
// slot (8 bytes at a load of 3/8 to 3/4) whatever its key's length. The key
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
	flagDoomed               // pending, and removed meanwhile: its Commit drops it (remove.go)
)

// keyBlock holds keyBlockData bytes of a key and links to the next block.
type keyBlock struct {
	data [keyBlockData]byte
	next uint32 // 1 + the next block, 0 at the last
}

const keyBlockData = 60

// indexErr makes a failure of the index's pools or table, out of mapped memory
// or of indexes, an ErrNoSpace: what the arena's callers handle.
func indexErr(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("arena index: %w: %w", err, ErrNoSpace)
}
