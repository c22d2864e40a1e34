package arena

import (
	"encoding/binary"
	"fmt"

	"github.com/zeebo/xxh3"

	"github.com/stratakv/strata/hostmem"
)

// superblock is the arena file's first page: its geometry, its secret and
// the counters that outlive a process.
type superblock struct {
	version   uint32
	state     uint32 // sbInUse while a service has it, sbClean after a clean Close
	gen       uint64 // one more on every write; the newer valid copy wins
	unit      int64
	size      int64
	slabBytes int64
	classes   uint64 // fingerprint of the size classes
	pageSize  int64
	dataOff   int64
	fileSize  int64
	secret    uint64 // keys every check word of the file
	contentID uint64 // random, new whenever the arena starts empty
	starts    uint64 // services started on the file (carried over a reformat)
	epoch     uint64 // high bits of commit sequences; one more per start
	pid       uint32 // the last service's pid, for messages
	objects   int64  // committed objects at the last clean Close
	bytes     int64  // and their bytes
	createdNS int64
	closedNS  int64 // the last clean Close
}

func (sb *superblock) encode(b []byte) {
	clear(b[:sbBytes])
	copy(b, sbMagic)
	le := binary.LittleEndian
	le.PutUint32(b[8:], sb.version)
	le.PutUint32(b[12:], sb.state)
	for i, v := range []uint64{sb.gen, uint64(sb.unit), uint64(sb.size), uint64(sb.slabBytes), sb.classes,
		uint64(sb.pageSize), uint64(sb.dataOff), uint64(sb.fileSize), sb.secret, sb.contentID, sb.starts, sb.epoch,
		uint64(sb.pid), uint64(sb.objects), uint64(sb.bytes), uint64(sb.createdNS), uint64(sb.closedNS)} {
		le.PutUint64(b[16+8*i:], v)
	}
	le.PutUint64(b[sbBytes-8:], xxh3.Hash(b[:sbBytes-8]))
}

// decodeSuperblock reads one copy; ok is false when it is not a valid one.
// magic reports whether it at least starts like one (a damaged superblock,
// rather than a file that never was an arena).
func decodeSuperblock(b []byte) (sb superblock, ok, magic bool) {
	if len(b) < sbBytes || string(b[:8]) != sbMagic {
		return sb, false, false
	}
	le := binary.LittleEndian
	if le.Uint64(b[sbBytes-8:]) != xxh3.Hash(b[:sbBytes-8]) {
		return sb, false, true
	}
	sb.version, sb.state = le.Uint32(b[8:]), le.Uint32(b[12:])
	v := make([]uint64, 17)
	for i := range v {
		v[i] = le.Uint64(b[16+8*i:])
	}
	sb.gen, sb.unit, sb.size, sb.slabBytes, sb.classes = v[0], int64(v[1]), int64(v[2]), int64(v[3]), v[4]
	sb.pageSize, sb.dataOff, sb.fileSize, sb.secret, sb.contentID = int64(v[5]), int64(v[6]), int64(v[7]), v[8], v[9]
	sb.starts, sb.epoch, sb.pid, sb.objects, sb.bytes = v[10], v[11], uint32(v[12]), int64(v[13]), int64(v[14])
	sb.createdNS, sb.closedNS = int64(v[15]), int64(v[16])
	return sb, true, true
}

// classesFingerprint identifies the size-class table: a file written with
// other classes cannot be reused.
var classesFingerprint = func() uint64 {
	b := make([]byte, 0, 8*len(classes))
	for _, c := range classes {
		b = binary.LittleEndian.AppendUint64(b, uint64(c))
	}
	return xxh3.Hash(b)
}()

// geometry is where the header and the data lie for a data region of size
// bytes in units of unit, on pages of pageSize.
type geometry struct {
	unit, size, slabBytes, pageSize int64
	umBytes, logOff, logBytes       int64
	dataOff, fileSize               int64
	align                           int64 // the data region's address alignment
}

// newGeometry lays out an arena; withLog gives it an eviction log (an arena
// file does, anonymous memory need not).
func newGeometry(unit, size, slabBytes, pageSize int64, withLog bool) geometry {
	g := geometry{unit: unit, size: size, slabBytes: slabBytes, pageSize: pageSize}
	g.umBytes = size / unit * 4
	g.logOff = roundUp(umOffset+g.umBytes, 4096)
	if withLog {
		g.logBytes = evictLogBytes
	}
	g.align = max(fileAlign, pageSize, unit)
	g.dataOff = roundUp(g.logOff+g.logBytes, g.align)
	g.fileSize = g.dataOff + roundUp(size, pageSize)
	return g
}

// headerBytes is what of the header is used: the superblock, the unit map
// and the log.
func (g geometry) headerBytes() int64 { return g.logOff + g.logBytes }

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// mismatch says how the superblock's geometry differs from g, "" when the
// file can be reused.
func (g geometry) mismatch(sb superblock) string {
	switch {
	case sb.version != layoutVersion:
		return fmt.Sprintf("its layout version is %d, this service writes version %d", sb.version, layoutVersion)
	case sb.size != g.size:
		return fmt.Sprintf("it holds an arena of %s, this service has --arena %s", hostmem.FormatBytes(sb.size), hostmem.FormatBytes(g.size))
	case sb.unit != g.unit:
		return fmt.Sprintf("its alignment is %d bytes, this service's %d", sb.unit, g.unit)
	case sb.slabBytes != g.slabBytes || sb.classes != classesFingerprint:
		return fmt.Sprintf("its slabs are of %d bytes in another class table, this service's of %d", sb.slabBytes, g.slabBytes)
	case sb.pageSize != g.pageSize:
		return fmt.Sprintf("it was laid out for pages of %d bytes, this file system's are %d", sb.pageSize, g.pageSize)
	case sb.dataOff != g.dataOff || sb.fileSize != g.fileSize:
		return fmt.Sprintf("its data lies at %d of %d bytes, this service's would at %d of %d", sb.dataOff, sb.fileSize, g.dataOff, g.fileSize)
	}
	return ""
}
