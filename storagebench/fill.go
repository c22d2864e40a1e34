package storagebench

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"
)

// fillChunk writes the pseudo-random bytes named by seed into b. Distinct seeds give distinct bytes (splitmix64 is a bijection of its
// counter), so a page read back from the wrong object, or half written, hashes
// differently; and no page is all zeros, which an unwritten page would be.
func fillChunk(b []byte, seed uint64) {
	x := mix(seed)
	for len(b) >= 8 {
		x += 0x9e3779b97f4a7c15
		binary.LittleEndian.PutUint64(b, mix(x))
		b = b[8:]
	}
	for i := range b {
		x += 0x9e3779b97f4a7c15
		b[i] = byte(mix(x)) | 1
	}
}

// mix is splitmix64's output function.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// chunkSeed names the contents of one part of one page of one batch.
func chunkSeed(seed uint64, batch, page, part int) uint64 {
	return mix(seed ^ mix(uint64(batch)<<40^uint64(page)<<8^uint64(part)))
}

// hashChunk is what verification compares.
func hashChunk(b []byte) uint64 { return xxh3.Hash(b) }
