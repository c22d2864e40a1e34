package redisstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/zeebo/xxh3"

	"github.com/stratakv/strata/storage"
)

// Keys. An object's keys all begin with "{name}", so Redis Cluster hashes all of
// them by the same tag and keeps them on one shard, whatever bytes name holds (a
// '}' inside name ends the tag early, but at the same place for every key of the
// object). Keys are told apart from the right: ":h" or ":" and a decimal index.

func headerKey(name string) string { return "{" + name + "}:h" }

func chunkKey(name string, i int) string {
	b := make([]byte, 0, len(name)+8)
	b = append(b, '{')
	b = append(b, name...)
	b = append(b, '}', ':')
	return string(strconv.AppendInt(b, int64(i), 10))
}

// maxNameBytes bounds an object name (Redis takes keys of any size; a bound keeps
// a bad caller from making huge ones).
const maxNameBytes = 4096

func checkName(name string) error {
	if name == "" || len(name) > maxNameBytes {
		return fmt.Errorf("redis store: object name of %d bytes, want 1 to %d: %w", len(name), maxNameBytes, storage.ErrBatch)
	}
	return nil
}

// The header key holds (all integers little-endian):
//
//	[0, 8)    magic "STRATARS"
//	[8, 10)   version (1)
//	[10, 12)  flags (0)
//	[12, 20)  storage.Format of the writer
//	[20, 28)  body length in bytes
//	[28, 36)  xxh3-64 of the body
//	[36, 44)  xxh3-64 of the object name, so keys renamed by hand are caught
//	[44, 52)  the writer's ChunkBytes
//	[52, 56)  chunk count
//	[56, 60)  plan entries E
//	[60, 60+16E) the plan: E pairs (chunk length u64, repeat u64), chunk by chunk
//	[.., +8)  xxh3-64 of every byte before it
const (
	headerMagic    = "STRATARS"
	headerVersion  = 1
	offFlags       = 10
	offFormat      = 12
	offBodyLen     = 20
	offBodySum     = 28
	offNameSum     = 36
	offChunkBytes  = 44
	offChunks      = 52
	offEntries     = 56
	offPlan        = 60
	planEntryBytes = 16
	// maxChunks bounds the chunks of one object (and so its keys and its plan).
	maxChunks = 1 << 16
	// maxHeaderBytes bounds what a header can be.
	maxHeaderBytes = offPlan + maxChunks*planEntryBytes + 8
)

// header is what an object's header key says about it.
type header struct {
	format     storage.Format
	bodyLen    int64
	bodySum    uint64
	nameSum    uint64
	chunkBytes int64
	plan       []int64 // chunk lengths, in order
}

// encode returns the header's bytes.
func (h header) encode() []byte {
	type entry struct{ n, rep int64 }
	var entries []entry
	for _, n := range h.plan {
		if k := len(entries) - 1; k >= 0 && entries[k].n == n {
			entries[k].rep++
			continue
		}
		entries = append(entries, entry{n, 1})
	}
	b := make([]byte, offPlan+len(entries)*planEntryBytes+8)
	copy(b, headerMagic)
	binary.LittleEndian.PutUint16(b[len(headerMagic):], headerVersion)
	binary.LittleEndian.PutUint16(b[offFlags:], 0)
	binary.LittleEndian.PutUint64(b[offFormat:], uint64(h.format))
	binary.LittleEndian.PutUint64(b[offBodyLen:], uint64(h.bodyLen))
	binary.LittleEndian.PutUint64(b[offBodySum:], h.bodySum)
	binary.LittleEndian.PutUint64(b[offNameSum:], h.nameSum)
	binary.LittleEndian.PutUint64(b[offChunkBytes:], uint64(h.chunkBytes))
	binary.LittleEndian.PutUint32(b[offChunks:], uint32(len(h.plan)))
	binary.LittleEndian.PutUint32(b[offEntries:], uint32(len(entries)))
	for i, e := range entries {
		o := offPlan + i*planEntryBytes
		binary.LittleEndian.PutUint64(b[o:], uint64(e.n))
		binary.LittleEndian.PutUint64(b[o+8:], uint64(e.rep))
	}
	end := len(b) - 8
	binary.LittleEndian.PutUint64(b[end:], xxh3.Hash(b[:end]))
	return b
}

// errHeader reports a header that is not one this package wrote intact.
var errHeader = errors.New("bad object header")

// decodeHeader parses and checks a header read from Redis. It never panics: b is
// outside input.
func decodeHeader(b []byte) (header, error) {
	if len(b) < offPlan+8 {
		return header{}, fmt.Errorf("%d bytes, want at least %d: %w", len(b), offPlan+8, errHeader)
	}
	if string(b[:len(headerMagic)]) != headerMagic {
		return header{}, fmt.Errorf("no magic: %w", errHeader)
	}
	end := len(b) - 8
	if binary.LittleEndian.Uint64(b[end:]) != xxh3.Hash(b[:end]) {
		return header{}, fmt.Errorf("header checksum mismatch: %w", errHeader)
	}
	if v := binary.LittleEndian.Uint16(b[len(headerMagic):]); v != headerVersion {
		return header{}, fmt.Errorf("version %d, want %d: %w", v, headerVersion, errHeader)
	}
	h := header{
		format:  storage.Format(binary.LittleEndian.Uint64(b[offFormat:])),
		bodySum: binary.LittleEndian.Uint64(b[offBodySum:]),
		nameSum: binary.LittleEndian.Uint64(b[offNameSum:]),
	}
	bodyLen := binary.LittleEndian.Uint64(b[offBodyLen:])
	chunkBytes := binary.LittleEndian.Uint64(b[offChunkBytes:])
	chunks := binary.LittleEndian.Uint32(b[offChunks:])
	entries := binary.LittleEndian.Uint32(b[offEntries:])
	switch {
	case bodyLen == 0 || bodyLen > 1<<62:
		return header{}, fmt.Errorf("body of %d bytes: %w", bodyLen, errHeader)
	case chunkBytes == 0 || chunkBytes > 1<<62:
		return header{}, fmt.Errorf("chunks of %d bytes: %w", chunkBytes, errHeader)
	case chunks == 0 || chunks > maxChunks || entries == 0 || entries > chunks:
		return header{}, fmt.Errorf("%d chunks in %d plan entries: %w", chunks, entries, errHeader)
	case uint64(end) != offPlan+uint64(entries)*planEntryBytes:
		return header{}, fmt.Errorf("%d bytes for %d plan entries: %w", len(b), entries, errHeader)
	}
	h.bodyLen, h.chunkBytes = int64(bodyLen), int64(chunkBytes)
	h.plan = make([]int64, 0, chunks)
	var total uint64
	for i := 0; i < int(entries); i++ {
		o := offPlan + i*planEntryBytes
		n := binary.LittleEndian.Uint64(b[o:])
		rep := binary.LittleEndian.Uint64(b[o+8:])
		if n == 0 || n > bodyLen || rep == 0 || rep > uint64(chunks)-uint64(len(h.plan)) {
			return header{}, fmt.Errorf("plan entry %d: %d chunks of %d bytes: %w", i, rep, n, errHeader)
		}
		for range rep {
			total += n
			if total > bodyLen {
				return header{}, fmt.Errorf("plan covers more than the body's %d bytes: %w", bodyLen, errHeader)
			}
			h.plan = append(h.plan, int64(n))
		}
	}
	if total != bodyLen || len(h.plan) != int(chunks) {
		return header{}, fmt.Errorf("plan of %d chunks and %d bytes for %d chunks and %d bytes: %w", len(h.plan), total, chunks, bodyLen, errHeader)
	}
	return h, nil
}

// groupBelow is the run length under which runs are grouped: one chunk takes
// several consecutive short runs (staged through a buffer, a copy) rather than
// one key and one command each. Runs this long or longer get chunks of their own
// that move straight between the socket and host memory.
const groupBelow = 64 << 10

// cutPlan returns the chunk lengths of a body made of runs, cut at most every
// chunkBytes: a run of at least groupBelow bytes is cut into chunks of its own, so
// that no chunk crosses a run and reads and writes need no copy; shorter
// consecutive runs share chunks of up to chunkBytes.
func cutPlan(runs [][]byte, chunkBytes int64) ([]int64, error) {
	small := min(int64(groupBelow), chunkBytes)
	var plan []int64
	var pending int64
	for _, r := range runs {
		n := int64(len(r))
		if n == 0 {
			continue
		}
		if n < small {
			if pending+n > chunkBytes {
				plan = append(plan, pending)
				pending = 0
			}
			pending += n
			continue
		}
		if pending > 0 {
			plan = append(plan, pending)
			pending = 0
		}
		for n > 0 {
			c := min(n, chunkBytes)
			plan = append(plan, c)
			n -= c
		}
	}
	if pending > 0 {
		plan = append(plan, pending)
	}
	if len(plan) > maxChunks {
		return nil, fmt.Errorf("redis store: an object of %d runs makes %d chunks, at most %d; pass fewer, longer runs or raise ChunkBytes: %w",
			len(runs), len(plan), maxChunks, storage.ErrBatch)
	}
	return plan, nil
}

func samePlan(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// chunkSpan is where one chunk's bytes are in host memory: one slice of a run
// (direct), or the pieces of several runs it spans, moved through a staging
// buffer.
type chunkSpan struct {
	direct []byte
	pieces [][]byte
	n      int64
}

// mapPlan places plan's chunks on runs, whose total length must be the plan's.
func mapPlan(runs [][]byte, plan []int64) []chunkSpan {
	out := make([]chunkSpan, len(plan))
	ri, off := 0, 0
	for ci, n := range plan {
		out[ci].n = n
		for ri < len(runs) && off == len(runs[ri]) {
			ri, off = ri+1, 0
		}
		if int64(len(runs[ri])-off) >= n {
			out[ci].direct = runs[ri][off : off+int(n) : off+int(n)]
			off += int(n)
			continue
		}
		need := n
		for need > 0 {
			for off == len(runs[ri]) {
				ri, off = ri+1, 0
			}
			take := min(need, int64(len(runs[ri])-off))
			out[ci].pieces = append(out[ci].pieces, runs[ri][off:off+int(take)])
			off += int(take)
			need -= take
		}
	}
	return out
}

func runsLen(runs [][]byte) int64 {
	var n int64
	for _, r := range runs {
		n += int64(len(r))
	}
	return n
}

// sumRuns is the xxh3-64 of the concatenation of runs.
func sumRuns(runs [][]byte) uint64 {
	if len(runs) == 1 {
		return xxh3.Hash(runs[0])
	}
	h := xxh3.New()
	for _, r := range runs {
		_, _ = h.Write(r)
	}
	return h.Sum64()
}
