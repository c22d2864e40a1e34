package arena

import (
	"encoding/binary"
	"runtime/debug"
	"slices"

	"github.com/zeebo/xxh3"
)

// The eviction log. An object that OnEvict kept elsewhere (the node's spill)
// leaves the arena file at once, but the spill may hold it in a write buffer
// of process memory for a while: a kill then loses it, in neither tier. So
// an arena file keeps, in its header, a ring of the keys of its recent
// evictions (and of removals, which end the claim), about the bytes of the
// spill's write buffers; a restarted service gets the evictions the ring
// recorded (RecentEvictions) and checks that each is in the arena or the
// spill, counting and logging the ones that are not as lost. It never serves
// from the ring: it only says what may be gone.
//
// A record, 8-byte aligned:
//
//	[0, 4)   length of the record (a multiple of 8)
//	[4]      kind: logEvicted or logRemoved
//	[6, 8)   key length
//	[8, 16)  sequence (one more per record: the newest of a key wins)
//	[16, 24) format
//	[24, 28) check: xxh3 of [0, 24) and the key, seeded by the file's secret
//	[32, …)  the key
//
// Records are written in place, wrapping at the end; a torn or overwritten
// one fails its check and is skipped.

// evictLogBytes is the ring's size: the node's spill buffers 2 × 4 MiB, and a
// record is never larger than the spill's record of the same object.
const evictLogBytes = 8 << 20

const (
	logEvicted = 1
	logRemoved = 2
	logHeader  = 32
)

// RecentEviction is an object evicted (and kept elsewhere) shortly before the
// arena file's last service ended, and not removed after.
type RecentEviction struct {
	Key    string
	Format uint64
}

// evictLog is the ring, in the arena file's mapping; nil buf for an
// anonymous arena.
type evictLog struct {
	buf    []byte
	pos    int64
	seq    uint64
	recent []RecentEviction // what the file held at New, newest first
}

func (a *Arena) logCheck(rec []byte, key []byte) uint32 {
	h := xxh3.HashSeed(rec[:24], a.secret)
	c := uint32(xxh3.HashSeed(key, h))
	if c == 0 {
		c = 1
	}
	return c
}

// appendLogLocked records an eviction or a removal of key.
func (a *Arena) appendLogLocked(kind uint8, key string, format uint64) {
	l := &a.elog
	if l.buf == nil {
		return
	}
	n := roundUp(int64(logHeader+len(key)), 8)
	if l.pos+n > int64(len(l.buf)) {
		l.pos = 0
	}
	rec := l.buf[l.pos : l.pos+n : l.pos+n]
	le := binary.LittleEndian
	le.PutUint32(rec[24:], 0) // invalid until the whole record is written
	le.PutUint32(rec[0:], uint32(n))
	rec[4], rec[5] = kind, 0
	le.PutUint16(rec[6:], uint16(len(key)))
	l.seq++
	le.PutUint64(rec[8:], l.seq)
	le.PutUint64(rec[16:], format)
	le.PutUint32(rec[28:], 0)
	copy(rec[logHeader:], key)
	le.PutUint32(rec[24:], a.logCheck(rec, rec[logHeader:logHeader+len(key)]))
	l.pos += n
}

// readLog finds the ring's records, notes the evictions that no later record
// of their key ends (newest first), and continues the ring after its newest
// record.
func (a *Arena) readLog() {
	l := &a.elog
	type entry struct {
		seq    uint64
		kind   uint8
		format uint64
		key    string
		end    int64
	}
	var found []entry
	le := binary.LittleEndian
	for off := int64(0); off+logHeader <= int64(len(l.buf)); {
		rec := l.buf[off:]
		n := int64(le.Uint32(rec[0:]))
		kl := int64(le.Uint16(rec[6:]))
		kind := rec[4]
		if n%8 != 0 || n < logHeader+kl || off+n > int64(len(l.buf)) || kl < 1 || kl > MaxKeyBytes ||
			(kind != logEvicted && kind != logRemoved) || le.Uint32(rec[24:]) != a.logCheck(rec, rec[logHeader:logHeader+kl]) {
			off += 8
			continue
		}
		found = append(found, entry{seq: le.Uint64(rec[8:]), kind: kind, format: le.Uint64(rec[16:]),
			key: string(rec[logHeader : logHeader+kl]), end: off + n})
		off += n
	}
	slices.SortFunc(found, func(x, y entry) int {
		switch {
		case x.seq > y.seq:
			return -1
		case x.seq < y.seq:
			return 1
		}
		return 0
	})
	if len(found) > 0 {
		l.seq, l.pos = found[0].seq, found[0].end
	}
	seen := map[string]bool{}
	for _, e := range found {
		if seen[e.key] {
			continue
		}
		seen[e.key] = true
		if e.kind == logEvicted {
			l.recent = append(l.recent, RecentEviction{Key: e.key, Format: e.format})
		}
	}
}

// RecentEvictions is the objects the arena file's last service evicted, and
// its OnEvict kept elsewhere, shortly before it ended, and that no removal
// ended since: newest first, nil for an anonymous arena or a file that started
// empty. A restarted service checks that each is in the arena or where
// OnEvict kept it: one that is in neither was lost by the kill (a spill's
// write buffer dies with its process).
func (a *Arena) RecentEvictions() []RecentEviction {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.elog.recent
}

// ForgetEvictions ends the claim of evictions a restarted service has
// checked (RecentEvictions): a removal record for each, as a Remove writes,
// so that the next start neither reports a lost one again nor reports one
// that was found now and dropped from the spill later, as lost by a kill.
func (a *Arena) ForgetEvictions(checked []RecentEviction) {
	defer a.guard(debug.SetPanicOnFault(true), nil)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || a.broken() {
		return
	}
	for _, e := range checked {
		a.appendLogLocked(logRemoved, e.Key, e.Format)
	}
	a.elog.recent = nil
}
