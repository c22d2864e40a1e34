package spill

import (
	"encoding/binary"
	"fmt"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"
)

// A hint file lists the records of one finished segment, so that New rebuilds
// the index from it without reading the segment's headers (one read per
// record: about 1.4 s per GiB of 64 KiB objects). It is written, without an
// fsync, once the segment's last write is done, and read only when it is
// whole (checksum) and covers the segment file's length; otherwise New reads
// the segment. All fields are little-endian:
//
//	[0, 8)    magic "STRHINT1"
//	[8, 12)   segment id
//	[12, 16)  entry count
//	[16, 24)  the segment file's length
//	[24, 32)  zero
//	then 48 bytes per record, in index order: kind (1), zero (3), header
//	length (4), offset (8), data length (8), format (8), key hash (16); a
//	tombstone's format is its header's (the segment of the remove that
//	compaction carried forward, or 0), and hint files of earlier versions
//	have 0 for a tombstone's header length and offset
//	[end-8, end) xxh3-64 of everything before
const (
	hintMagic  = "STRHINT1"
	hintHeader = 32
	hintEntry  = 48
)

// hint is one record of a segment as its hint file lists it.
type hint struct {
	kind   uint8
	hdrLen uint32
	off    int64
	size   int64
	format uint64
	hash   [16]byte
}

func hintName(id uint32) string { return fmt.Sprintf("%08x.hint", id) }

// encodeHints is the hint file of segment id, size bytes long.
func encodeHints(id uint32, size int64, hs []hint) []byte {
	b := make([]byte, hintHeader+hintEntry*len(hs)+8)
	copy(b, hintMagic)
	binary.LittleEndian.PutUint32(b[8:], id)
	binary.LittleEndian.PutUint32(b[12:], uint32(len(hs)))
	binary.LittleEndian.PutUint64(b[16:], uint64(size))
	for i, h := range hs {
		e := b[hintHeader+i*hintEntry:]
		e[0] = h.kind
		binary.LittleEndian.PutUint32(e[4:], h.hdrLen)
		binary.LittleEndian.PutUint64(e[8:], uint64(h.off))
		binary.LittleEndian.PutUint64(e[16:], uint64(h.size))
		binary.LittleEndian.PutUint64(e[24:], h.format)
		copy(e[32:48], h.hash[:])
	}
	n := len(b) - 8
	binary.LittleEndian.PutUint64(b[n:], xxh3.Hash(b[:n]))
	return b
}

// decodeHints parses a hint file of segment id whose file is size bytes. It
// never panics: b is outside input.
func decodeHints(b []byte, id uint32, size int64) ([]hint, error) {
	if len(b) < hintHeader+8 || string(b[:8]) != hintMagic {
		return nil, fmt.Errorf("not a hint file: %w", errRecord)
	}
	n := len(b) - 8
	if binary.LittleEndian.Uint64(b[n:]) != xxh3.Hash(b[:n]) {
		return nil, fmt.Errorf("hint checksum mismatch: %w", errRecord)
	}
	count := int(binary.LittleEndian.Uint32(b[12:]))
	switch {
	case binary.LittleEndian.Uint32(b[8:]) != id:
		return nil, fmt.Errorf("hints of segment %d: %w", binary.LittleEndian.Uint32(b[8:]), errRecord)
	case int64(binary.LittleEndian.Uint64(b[16:])) != size:
		return nil, fmt.Errorf("hints of a segment of %d bytes, the file has %d: %w", binary.LittleEndian.Uint64(b[16:]), size, errRecord)
	case binary.LittleEndian.Uint64(b[24:]) != 0:
		return nil, fmt.Errorf("reserved bytes set: %w", errRecord)
	case n != hintHeader+count*hintEntry:
		return nil, fmt.Errorf("%d entries in %d bytes: %w", count, len(b), errRecord)
	}
	hs := make([]hint, count)
	for i := range hs {
		e := b[hintHeader+i*hintEntry:]
		if e[1]|e[2]|e[3] != 0 || binary.LittleEndian.Uint64(e[8:]) > 1<<62 || binary.LittleEndian.Uint64(e[16:]) > maxData {
			return nil, fmt.Errorf("entry %d: reserved bytes or lengths out of range: %w", i, errRecord)
		}
		h := hint{
			kind:   e[0],
			hdrLen: binary.LittleEndian.Uint32(e[4:]),
			off:    int64(binary.LittleEndian.Uint64(e[8:])),
			size:   int64(binary.LittleEndian.Uint64(e[16:])),
			format: binary.LittleEndian.Uint64(e[24:]),
		}
		copy(h.hash[:], e[32:48])
		switch {
		case h.kind != kindObject && h.kind != kindTombstone:
			return nil, fmt.Errorf("entry %d: kind %d: %w", i, h.kind, errRecord)
		case h.kind == kindObject && (h.hdrLen%sector != 0 || h.hdrLen == 0 || h.hdrLen > maxHeader || h.off%sector != 0 ||
			h.size == 0 || h.size > maxData || h.off+int64(h.hdrLen)+h.size > size):
			return nil, fmt.Errorf("entry %d: a record of %d+%d bytes at %d in a segment of %d: %w", i, h.hdrLen, h.size, h.off, size, errRecord)
		}
		hs[i] = h
	}
	return hs, nil
}

// writeHints writes seg's hint file, unless seg went meanwhile or a write to
// it failed. It runs on the writer goroutine, without s.mu.
func (s *Store) writeHints(seg *segment) {
	s.mu.Lock()
	if seg.dropped || seg.broken || seg.hints == nil {
		s.mu.Unlock()
		return
	}
	b := encodeHints(seg.id, seg.size, seg.hints)
	seg.hints = nil
	s.mu.Unlock()
	name := hintName(seg.id)
	if err := s.writeFileAt(name, b); err != nil {
		s.log.Warn("spill: cannot write a segment's hint file; the next start reads the segment instead", "file", s.path(name), "err", err)
		return
	}
	s.mu.Lock()
	if seg.dropped {
		// Dropped while the file was written: it must not outlive its segment.
		_ = s.unlinkAt(name)
	}
	s.mu.Unlock()
	s.st.hintsWritten.Add(1)
}

// readHints returns the hints of segment id, or nil when it has no usable
// hint file: only a regular file of this user is read.
func (s *Store) readHints(id uint32, size int64) []hint {
	name := hintName(id)
	b, err := s.readOwnFile(name, maxHintFile(size))
	if err != nil {
		if err != unix.ENOENT {
			s.log.Info("spill: a segment's hint file cannot be used; reading the segment instead", "file", s.path(name), "err", err)
			_ = s.unlinkAt(name)
		}
		return nil
	}
	hs, err := decodeHints(b, id, size)
	if err != nil {
		s.log.Info("spill: a segment's hint file is stale or damaged; reading the segment instead", "file", s.path(name), "err", err)
		_ = s.unlinkAt(name)
		return nil
	}
	return hs
}

// maxHintFile bounds the hint file of a segment of size bytes: an entry per
// sector at most.
func maxHintFile(size int64) int64 { return hintHeader + 8 + hintEntry*(size/sector+1) }
