// Package spill is the node service's SSD tier: objects evicted from the DRAM
// arena are appended to segment files, one after another, instead of each
// becoming a file of its own (creating and removing an inode per object cost a
// quarter of the service's CPU).
//
// A put copies the object, behind a header that names it (key, format, length,
// checksums), into one of two write buffers of mapped memory; a writer
// goroutine writes a full buffer to the end of the current segment with one
// O_DIRECT write while puts fill the other. An object too large for a buffer
// is written straight from the caller's memory, its header padded to 4 KiB so
// that its bytes keep their alignment. An index in memory maps a 128-bit hash
// of each key to its record (segment, offset, length, format), in records and
// a hash table mapped outside the Go heap (index.go: about 60 bytes an object,
// and nothing for the garbage collector to scan or sweep); a read checks
// the record's header, the key in it included, and the data's checksum, so it
// never serves another key's bytes or damaged ones. A record still in a write
// buffer is read from the buffer.
//
// The spill is a cache: when it reaches its capacity (or the device its free
// space) it drops its oldest segment whole, and the objects in it with it (the
// hot ones are in the arena anyway). A remove forgets the object and appends a
// tombstone so that it stays removed after a restart; its bytes go with their
// segment. New rebuilds the index by reading the record headers of every
// segment, stopping a segment at its first bad record (a write torn by a crash)
// and cutting it there; the data of the newest segment, the one a crash tears,
// is verified as well, and every read verifies the rest.
package spill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sync"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/internal/vecio"
	"github.com/stratakv/strata/storage"
)

// Store is a spill directory of segment files. It is safe for concurrent use.
type Store struct {
	lock     int // the directory's lock file, held while open
	cfg      Config
	dir      string
	log      *slog.Logger
	segBytes int64 // SegmentBytes, lowered for a small capacity
	bufBytes int64
	// dioAlign and dioMem are the file offset and memory alignments that
	// reads with O_DIRECT need (statx), at most a block: where a record's data
	// lies at such an offset, a get reads it straight into the caller's memory.
	dioAlign, dioMem int64

	// freeBytes, when set, replaces the device's free space (statfs) in tests.
	freeBytes func() int64
	// pwritev, when set, replaces the write of records in tests (faults).
	pwritev func(fd int, iovs [][]byte, off int64) (int, error)

	writer   sync.WaitGroup // the writer goroutine
	inflight sync.WaitGroup // calls in flight
	mapped   []byte         // both write buffers, one mapping
	scratch  scratchPools   // read windows and direct-write bounce buffers

	mu       sync.Mutex
	cond     *sync.Cond // a buffer freed or copied, a write done, the queue grew, a context ended
	closed   bool       // no new calls
	stopping bool       // the writer ends once the queue is empty
	direct   bool       // O_DIRECT in use
	idx      index      // off the Go heap; closed by Close
	segs     []*segment // live segments, oldest first; the active one last
	byID     map[uint32]*segment
	active   *segment // where records go; nil until the first put
	nextID   uint32
	bufs     [2]*stageBuf
	cur      *stageBuf   // the buffer being filled, nil when none
	queue    []*stageBuf // sealed buffers for the writer, in file order
	hintSegs []*segment  // finished segments whose hint file the writer writes

	used       int64 // bytes of every live segment, reserved ones included
	unwritten  int64 // of those, bytes not yet written
	liveBytes  int64 // data bytes of the indexed objects
	devLimit   int64 // bytes on the device at the last statfs plus its free space
	statfsUsed int64 // used at the last statfs

	st counters
}

// entry is where an object's record is, as the index returns it.
type entry struct {
	seg    uint32
	hdrLen uint32
	off    int64
	size   int64
	format uint64
}

// segment is one segment file.
type segment struct {
	id   uint32
	path string
	fd   int
	// size is the bytes of records placed in the file, written or not.
	size int64
	// head is the first of its records on the index's list of them, for
	// dropping it.
	head uint32
	// refs counts reads and writes on fd in flight; a dropped segment's fd is
	// closed when the last ends.
	refs int
	// pending counts buffers and records placed in it and not yet written: a
	// segment with writes to come is never dropped.
	pending int
	dropped bool
	// broken: a write to it failed, and nothing more is appended to it.
	broken bool
	// hints are its records in index order, for its hint file, until that is
	// written; hinted says it was queued for that (or needs none).
	hints  []hint
	hinted bool
}

// bufState is where a write buffer is in its cycle.
type bufState uint8

const (
	bufFree    bufState = iota
	bufFilling          // the current buffer: puts copy records into it
	bufSealed           // queued for the writer, or being written
)

// stageBuf is a write buffer: a run of its segment from start, n bytes long.
type stageBuf struct {
	mem     []byte
	state   bufState
	seg     *segment
	start   int64
	n       int64
	copying int        // puts copying into it now: the writer waits for them
	readers int        // gets copying out of it now: it is reused after them
	keys    [][16]byte // object records in it, unindexed if its write fails
}

// New opens (or creates) the spill in cfg.Dir, rebuilds its index from the
// segment files there, and starts its writer.
func New(cfg Config) (*Store, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("spill %s: %w: %w", cfg.Dir, err, storage.ErrConfig)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("spill: cannot create directory %s (%v); create it, or point --spill-dir at a directory this user can write: %w", dir, err, storage.ErrConfig)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	s := &Store{
		lock:     lock,
		cfg:      cfg,
		dir:      dir,
		log:      cfg.Logger,
		bufBytes: cfg.BufferBytes,
		direct:   cfg.DirectIO,
		byID:     map[uint32]*segment{},
		nextID:   1,
	}
	s.dioAlign, s.dioMem = dioAlignment(lock, cfg.DirectIO)
	s.cond = sync.NewCond(&s.mu)
	if s.idx, err = newIndex(); err != nil {
		_ = unix.Close(lock)
		return nil, err
	}
	if err := s.recover(); err != nil {
		s.closeSegments()
		s.idx.close()
		_ = unix.Close(lock)
		return nil, err
	}
	// Lowered for a small spill (or a small device), so that dropping the
	// oldest segment frees an eighth of it, not all of it.
	capacity := min(cfg.CapacityBytes, s.used+s.deviceFree())
	s.segBytes = min(cfg.SegmentBytes, max(roundDown(capacity/8, block), minSegment))
	s.refreshLimitLocked()
	mem, err := unix.Mmap(-1, 0, int(2*s.bufBytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		s.closeSegments()
		s.idx.close()
		_ = unix.Close(lock)
		return nil, fmt.Errorf("spill %s: mapping two write buffers of %d bytes: %v: %w", dir, s.bufBytes, err, storage.ErrConfig)
	}
	s.mapped = mem
	for i := range s.bufs {
		s.bufs[i] = &stageBuf{mem: mem[int64(i)*s.bufBytes : int64(i+1)*s.bufBytes : int64(i+1)*s.bufBytes]}
	}
	s.dropOverLocked()
	s.writer.Add(1)
	go s.write()
	return s, nil
}

// Dir is the spill's directory, as an absolute path.
func (s *Store) Dir() string { return s.dir }

// Close writes the records still buffered, waits for the calls in flight and
// closes the segment files. Later calls fail with storage.ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.inflight.Wait()
	s.mu.Lock()
	s.sealLocked()
	s.stopping = true
	s.cond.Broadcast()
	s.mu.Unlock()
	s.writer.Wait()
	s.closeSegments()
	s.mu.Lock()
	s.idx.close() // no call is in flight, and the writer is gone
	s.mu.Unlock()
	var err error
	if s.mapped != nil {
		err = unix.Munmap(s.mapped)
		s.mapped = nil
	}
	_ = unix.Close(s.lock) // releases the directory
	return err
}

// lockName is the file a spill holds locked (flock) while it is open.
const lockName = "spill.lock"

// lockDir locks dir for this spill: two spills appending to and dropping the
// same segment files would destroy each other's objects.
func lockDir(dir string) (int, error) {
	path := dir + "/" + lockName
	fd, err := vecio.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return -1, fmt.Errorf("spill: cannot create %s (%v); give this user write permission on the directory, or point --spill-dir at one it can write: %w", path, err, storage.ErrConfig)
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		_ = unix.Close(fd)
		if err == unix.EWOULDBLOCK {
			return -1, fmt.Errorf("spill directory %s is in use by another process (another node service?); give each service its own --spill-dir: %w", dir, storage.ErrConfig)
		}
		return -1, fmt.Errorf("spill: cannot lock %s (%v): %w", path, err, storage.ErrConfig)
	}
	return fd, nil
}

func (s *Store) closeSegments() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, seg := range s.segs {
		if !seg.dropped {
			seg.dropped = true
			_ = unix.Close(seg.fd)
		}
	}
}

// begin admits a call; the caller calls s.inflight.Done when it ends.
func (s *Store) begin(op, key string) error {
	if key == "" || len(key) > maxKey {
		return fmt.Errorf("spill: %s: key of %d bytes: want 1 to %d: %w", op, len(key), maxKey, storage.ErrBatch)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("spill %s: %s %s: %w", s.dir, op, key, storage.ErrClosed)
	}
	s.inflight.Add(1)
	return nil
}

// hashKey names key in the index. Two keys of one hash are the one risk of a
// wrong answer from the index alone (2^-128 a pair); reads compare the key in
// the record's header, so they never serve the other key's bytes.
func hashKey(key string) [16]byte {
	return xxh3.HashString128(key).Bytes()
}

func runsLen(runs [][]byte) int64 {
	var n int64
	for _, r := range runs {
		n += int64(len(r))
	}
	return n
}

// ObjectSize returns the data length of key's object in format: an error
// wrapping storage.ErrNotFound when the spill has none, and also ErrOtherFormat
// when it holds one of another format.
func (s *Store) ObjectSize(ctx context.Context, key string, format storage.Format) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, ctxError("stat", err)
	}
	if err := s.begin("stat", key); err != nil {
		return 0, err
	}
	defer s.inflight.Done()
	s.mu.Lock()
	e, ok := s.idx.get(hashKey(key))
	s.mu.Unlock()
	switch {
	case !ok:
		return 0, fmt.Errorf("spill: object %s: %w", key, storage.ErrNotFound)
	case e.format != uint64(format):
		return 0, fmt.Errorf("spill: object %s is stored in format %#x, not %#x: %w (%w)", key, e.format, uint64(format), storage.ErrNotFound, ErrOtherFormat)
	}
	return e.size, nil
}

// RemoveObject forgets key's object and reports whether there was one. It
// appends a tombstone, so that the object stays removed after a restart; its
// bytes are reclaimed with its segment.
func (s *Store) RemoveObject(ctx context.Context, key string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, ctxError("remove", err)
	}
	if err := s.begin("remove", key); err != nil {
		return false, err
	}
	defer s.inflight.Done()
	h := hashKey(key)
	s.mu.Lock()
	if s.idx.find(h) == 0 {
		s.mu.Unlock()
		return false, nil
	}
	s.mu.Unlock()
	had, err := s.stage(ctx, kindTombstone, key, h, 0, nil)
	if err != nil {
		// Forgotten all the same: only a restart could bring it back.
		s.mu.Lock()
		if s.unindexLocked(h) {
			had = true
		}
		s.mu.Unlock()
		s.log.Warn("spill: the tombstone of a removed object could not be written; it is removed, but may be back after a restart",
			"key", key, "err", err)
	}
	if had {
		s.st.removed.Add(1)
	}
	return had, nil
}

// unindexLocked forgets h and reports whether it was indexed.
func (s *Store) unindexLocked(h [16]byte) bool {
	e, ok := s.idx.remove(h)
	if ok {
		s.liveBytes -= e.size
	}
	return ok
}

// indexLocked records e, a record in seg, for h, replacing an older entry.
func (s *Store) indexLocked(seg *segment, h [16]byte, e entry) error {
	old, replaced, err := s.idx.add(&seg.head, h, e)
	if replaced {
		s.liveBytes -= old.size
	}
	if err == nil {
		s.liveBytes += e.size
	}
	return err
}

// ctxError is the error of a call whose context ended.
func ctxError(op string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("spill: %s: %w: %w", op, err, storage.ErrTimeout)
	}
	return fmt.Errorf("spill: %s: %w", op, err)
}

// ioError classifies a failed syscall: device or quota full is
// storage.ErrNoSpace, anything else storage.ErrIO. The errno stays in the chain.
func ioError(op, path string, err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("spill: %s %s: %w; free space on the device or lower --spill-capacity below its free space: %w",
			op, path, err, storage.ErrNoSpace)
	}
	return fmt.Errorf("spill: %s %s: %w: %w", op, path, err, storage.ErrIO)
}

// deviceFree is the bytes an unprivileged writer may still use on the spill's
// device (statfs f_bavail); a device that cannot say is taken to have room.
func (s *Store) deviceFree() int64 {
	if s.freeBytes != nil {
		return s.freeBytes()
	}
	var st unix.Statfs_t
	if err := unix.Statfs(s.dir, &st); err != nil || st.Bsize <= 0 || st.Blocks == 0 {
		return math.MaxInt64 / 4
	}
	if st.Bavail > uint64(math.MaxInt64/4)/uint64(st.Bsize) {
		return math.MaxInt64 / 4
	}
	return int64(st.Bavail) * st.Bsize
}

// segmentName is the file name of segment id: ids grow, and the names sort
// in their order.
func segmentName(id uint32) string { return fmt.Sprintf("%08x.seg", id) }

// parseSegmentName returns the id of a segment file name.
func parseSegmentName(name string) (uint32, bool) {
	var id uint32
	if len(name) != len("00000000.seg") {
		return 0, false
	}
	if n, err := fmt.Sscanf(name, "%08x.seg", &id); n != 1 || err != nil || segmentName(id) != name {
		return 0, false
	}
	return id, true
}

// dioAlignment returns the file offset and memory alignments that O_DIRECT
// reads of files in the spill's directory need, from statx of fd (a file
// there); a block where the filesystem does not say or asks for more, and no
// alignment without O_DIRECT.
func dioAlignment(fd int, direct bool) (offset, mem int64) {
	if !direct {
		return 1, 1
	}
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &st); err != nil || st.Mask&unix.STATX_DIOALIGN == 0 {
		return block, block
	}
	offset, mem = int64(st.Dio_offset_align), int64(st.Dio_mem_align)
	if offset == 0 || offset > block || block%offset != 0 || mem == 0 || mem > block || block%mem != 0 {
		return block, block
	}
	return offset, mem
}

// openSegment opens a segment file, with O_DIRECT while the spill uses it: a
// filesystem that refuses it (EINVAL) turns it off, with one log line.
func (s *Store) openSegment(path string, flags int) (int, error) {
	flags |= unix.O_CLOEXEC
	if s.direct {
		fd, err := vecio.Open(path, flags|unix.O_DIRECT, 0o644)
		if err != unix.EINVAL {
			return fd, err
		}
		if flags&unix.O_CREAT != 0 {
			_ = unix.Unlink(path) // created before the flag was refused; the name is ours
		}
		s.directRefused(path, err)
	}
	return vecio.Open(path, flags, 0o644)
}

// directRefused turns O_DIRECT off; s.mu is held or the store is being built.
func (s *Store) directRefused(path string, err error) {
	if s.direct {
		s.direct = false
		s.log.Warn("spill: the filesystem refuses O_DIRECT; using buffered I/O", "dir", s.dir, "file", path, "err", err)
	}
}
