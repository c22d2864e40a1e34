package storagetest

import (
	"fmt"

	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// patternByte is byte off (in part order) of logical page lp of a pool salted by
// salt, in pattern generation gen.
func patternByte(salt uint64, lp, gen int, off int64) byte {
	x := salt ^ uint64(lp)<<40 ^ uint64(gen)<<56 ^ uint64(off)*0x9E3779B97F4A7C15
	x ^= x >> 31
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 29
	return byte(x)
}

func poolSalt(spec storage.PoolSpec) uint64 {
	var h uint64 = 14695981039346656037
	for i := 0; i < len(spec.Name); i++ {
		h = (h ^ uint64(spec.Name[i])) * 1099511628211
	}
	return h
}

// eachByte calls fn with the address in the pool's memory and the part-order
// offset of every byte of page's object parts.
func eachByte(spec storage.PoolSpec, page pool.PageID, fn func(addr, off int64)) {
	off := int64(0)
	for _, s := range storage.Parts(spec, page) {
		for r := 0; r < s.Count; r++ {
			base := s.Offset + int64(r)*s.Stride
			for i := int64(0); i < s.RunBytes; i++ {
				fn(base+i, off)
				off++
			}
		}
	}
}

// Fill writes logical page lp's pattern of generation gen into host page page.
func Fill(spec storage.PoolSpec, page pool.PageID, lp, gen int) {
	mem, salt := spec.Region.Bytes(), poolSalt(spec)
	eachByte(spec, page, func(addr, off int64) { mem[addr] = patternByte(salt, lp, gen, off) })
}

// Clear zeroes host page page's object bytes.
func Clear(spec storage.PoolSpec, page pool.PageID) {
	mem := spec.Region.Bytes()
	eachByte(spec, page, func(addr, _ int64) { mem[addr] = 0 })
}

// Check reports whether host page page holds logical page lp's pattern of
// generation gen, and where it first does not.
func Check(spec storage.PoolSpec, page pool.PageID, lp, gen int) error {
	mem, salt := spec.Region.Bytes(), poolSalt(spec)
	var bad error
	eachByte(spec, page, func(addr, off int64) {
		if bad == nil && mem[addr] != patternByte(salt, lp, gen, off) {
			bad = fmt.Errorf("pool %q host page %d: byte %d of the object is %#x, want %#x (logical page %d, generation %d)",
				spec.Name, page, off, mem[addr], patternByte(salt, lp, gen, off), lp, gen)
		}
	})
	return bad
}

// fillRange fills host pages first..first+n-1 with logical pages 0..n-1.
func fillRange(spec storage.PoolSpec, first pool.PageID, n, gen int) {
	for i := 0; i < n; i++ {
		Fill(spec, first+pool.PageID(i), i, gen)
	}
}

func pageIDs(ids ...int) []pool.PageID {
	out := make([]pool.PageID, len(ids))
	for i, id := range ids {
		out[i] = pool.PageID(id)
	}
	return out
}

func seq(first, n int) []pool.PageID {
	out := make([]pool.PageID, n)
	for i := range out {
		out[i] = pool.PageID(first + i)
	}
	return out
}

func pick(keys []pagekey.Key, idx ...int) []pagekey.Key {
	out := make([]pagekey.Key, len(idx))
	for i, k := range idx {
		out[i] = keys[k]
	}
	return out
}
