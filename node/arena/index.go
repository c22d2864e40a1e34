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
// itself lies in the arena, in the object's slot (layout.go): after its bytes
// for a small object, in its descriptor slot for one in an extent of its own
// (whose bytes fill their extent to the alignment); lookups compare the real
// key bytes, so a hash collision never serves a foreign object. The index is
// this process's only: a restarted service rebuilds it from the slots
// (recover.go).

// record is one object's metadata. Its size is part of the arena's memory budget:
// keep it at 48 bytes.
type record struct {
	hash   uint64 // hash of the key
	format uint64
	// off is the byte offset in the region of the object's slot: where a small
	// object's bytes begin, or a large object's descriptor (its bytes lie where
	// the descriptor says).
	off  int64
	size int64 // the object's bytes
	// prev and next link the LRU list (record 0 is its sentinel).
	prev, next uint32
	// ref is 1 + the id of the slab the object's slot is in.
	ref    uint32
	keyLen uint16
	state  state
	flags  uint8
}

const (
	flagLarge     = 1 << iota // the object's bytes lie in an extent of their own, its slot is a descriptor
	flagEvicting              // OnEvict runs on it now: its bytes must stay
	flagTouched               // acquired while evicting: recently used after all
	flagInLRU                 // on the LRU list
	flagDoomed                // pending, and removed meanwhile: its Commit drops it (remove.go)
	flagRecovered             // found by recovery and not used since: its recency is its commit's (recover.go)
)

// indexErr makes a failure of the index's pools or table, out of mapped memory
// or of indexes, an ErrNoSpace: what the arena's callers handle.
func indexErr(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("arena index: %w: %w", err, ErrNoSpace)
}
