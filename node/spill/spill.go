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
// tombstone, and returns once the tombstone is written, so that the object
// stays removed after a restart; a record that fails its checks on a read is
// dropped with a tombstone too. A segment whose live objects fall below
// Config.CompactBelow of it is compacted (compact.go): its live objects, and
// the tombstones that still shadow older records, are copied to the end of the
// spill and its file is deleted, at a bounded rate. New rebuilds the index by
// reading the record headers of every segment (or its hint file), oldest
// first, a later record of a key overriding an earlier one, stopping a segment
// at its first bad record (a write torn by a crash) and cutting it there; the
// data of the newest segment, the one a crash tears, is verified as well, and
// every read verifies the rest.
//
// What the index says and what New would rebuild from the files agree for
// every key: the newest record of a key in file order (segment, offset) is its
// live object, or a tombstone when it has none. Puts, removes, drops of
// corrupt records and compaction's copies each place their record in the same
// critical section that checks and changes the key's index entry, so that
// file order is the order in which they change the index. A put is indexed
// (pending, invisible to reads) when it places its record: a remove while it
// copies its bytes in cancels it, with a tombstone after its record.
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
	"sync/atomic"

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
	// hook, when set, is called at named points of puts, removes, reads and
	// compaction, in tests: to hold one of them there, or to panic. Points
	// whose name ends in "-locked" are called with s.mu held.
	hook atomic.Pointer[func(point, key string)]
	// poisoned: a call panicked (a bug). Calls fail from then on, and Close
	// writes nothing more, since what the call held may never be released.
	poisoned atomic.Bool

	compactKick   chan struct{}      // a segment may have fallen below CompactBelow
	compactCtx    context.Context    // ends when Close stops compaction
	compactCancel context.CancelFunc // ends compactCtx
	compactor     sync.WaitGroup     // the compactor goroutine
	pacer         pacer              // compaction's bytes per second; used by the one compaction in flight

	writer   sync.WaitGroup // the writer goroutine
	inflight sync.WaitGroup // calls in flight
	mapped   []byte         // both write buffers, one mapping
	scratch  scratchPools   // read windows and direct-write bounce buffers

	mu       sync.Mutex
	cond     *sync.Cond // a buffer freed or copied, a write done, the queue grew, a context ended
	closed   bool       // no new calls
	stopping bool       // the writer ends once the queue is empty
	abandon  bool       // the writer ends at once, writing nothing more
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
	liveRec    int64 // record bytes of the indexed objects, headers and padding included
	devLimit   int64 // bytes on the device at the last statfs plus its free space
	statfsUsed int64 // used at the last statfs
	// bufWaiters counts puts and removes waiting for a write buffer, which
	// compaction lets go first; commitWaiters, compaction waiting for a put
	// to commit; pendingPuts, the objects indexed pending.
	bufWaiters    int
	commitWaiters int
	pendingPuts   int
	compacting    *segment // the segment being compacted, nil when none

	st counters
}

// entry is where an object's record is, as the index returns it.
type entry struct {
	seg    uint32
	hdrLen uint32
	off    int64
	size   int64
	format uint64
	// pending: placed by a put that is still copying its bytes; not yet
	// visible to reads and removes.
	pending bool
}

// recLen is the length of e's record: its header, data and padding.
func recLen(e entry) int64 {
	if e.hdrLen == block { // written straight from the caller's memory
		return roundUp(block+e.size, block)
	}
	return roundUp(int64(e.hdrLen)+e.size, sector)
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
	// liveRec is the record bytes of its indexed objects; tombs and tombBytes
	// count its tombstones. Compaction looks at them.
	liveRec   int64
	tombs     int
	tombBytes int64
	// compacting: the compactor is copying it. noCompact: a record in it
	// could not be read, and it goes only with age; compactFailed: its last
	// compaction stopped short, and it waits for more of it to die.
	compacting, noCompact, compactFailed bool
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
	waiters []*flushWait
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
	s.compactCtx, s.compactCancel = context.WithCancel(context.Background())
	s.pacer.rate = cfg.CompactBytesPerSec
	if cfg.CompactBelow > 0 {
		s.compactKick = make(chan struct{}, 1)
		s.compactor.Add(1)
		go s.compactLoop()
		s.compactKick <- struct{}{} // the segments found at start-up
	}
	return s, nil
}

// Dir is the spill's directory, as an absolute path.
func (s *Store) Dir() string { return s.dir }

// Close writes the records still buffered, waits for the calls in flight and
// closes the segment files. Later calls fail with storage.ErrClosed. After a
// call panicked (a bug), Close writes nothing more, returns an error, and
// what was buffered is lost as in a crash.
func (s *Store) Close() error {
	if !s.markClosed() {
		return nil
	}
	s.inflight.Wait()
	s.stopCompaction()
	lost := s.stopWriter(s.poisoned.Load())
	s.writer.Wait()
	s.closeSegments()
	s.closeIndex()
	var err error
	if s.mapped != nil {
		err = unix.Munmap(s.mapped)
		s.mapped = nil
	}
	_ = unix.Close(s.lock) // releases the directory
	if s.poisoned.Load() {
		err = errors.Join(err, fmt.Errorf("spill %s: a call panicked (a bug: see the log); closed without writing the %d bytes still buffered, which are lost: %w",
			s.dir, lost, storage.ErrIO))
	}
	return err
}

// markClosed refuses new calls, and reports whether s was open.
func (s *Store) markClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.closed = true
	return true
}

// stopWriter tells the writer to end: after writing what is buffered, or,
// with abandon, at once. It returns the bytes left unwritten by abandoning.
func (s *Store) stopWriter(abandon bool) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if abandon {
		s.abandon = true
	} else {
		s.sealLocked()
	}
	s.stopping = true
	s.cond.Broadcast()
	return s.unwritten
}

// stopCompaction ends the compaction in flight, if any, at its next step,
// and the compactor goroutine.
func (s *Store) stopCompaction() {
	s.mu.Lock()
	s.compactCancel()
	s.cond.Broadcast()
	s.mu.Unlock()
	s.compactor.Wait()
}

func (s *Store) closeIndex() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.idx.close() // no call is in flight, and the writer is gone
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

// begin admits a call; the caller defers s.end.
func (s *Store) begin(op, key string) error {
	if err := checkKey(op, key); err != nil {
		return err
	}
	return s.admit(op, key)
}

func checkKey(op, key string) error {
	if key == "" || len(key) > maxKey {
		return fmt.Errorf("spill: %s: key of %d bytes: want 1 to %d: %w", op, len(key), maxKey, storage.ErrBatch)
	}
	return nil
}

// admit counts a call in flight, unless the spill is closed or unusable.
func (s *Store) admit(op, what string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("spill %s: %s %s: %w", s.dir, op, what, storage.ErrClosed)
	}
	if s.poisoned.Load() {
		return errPoisoned(s.dir, op)
	}
	s.inflight.Add(1)
	return nil
}

func errPoisoned(dir, op string) error {
	return fmt.Errorf("spill %s: %s: an earlier call panicked (a bug: see the log), and the spill is unusable until the service restarts: %w", dir, op, storage.ErrIO)
}

// end ends a call that begin admitted. A call that panics leaves the spill
// poisoned: what it held (a write buffer being filled, an index entry) may
// never be released, so later calls fail fast and Close does not wait for
// it. Every critical section defers its unlock, so the mutex is free again by
// then.
func (s *Store) end() {
	if r := recover(); r != nil {
		s.poisoned.Store(true)
		s.log.Error("spill: a call panicked; the spill refuses calls until the service restarts", "dir", s.dir, "panic", r)
		go s.wake() // waits that check poisoned; the lock may be contended
		s.inflight.Done()
		panic(r)
	}
	s.inflight.Done()
}

// locked runs fn with s.mu held.
func (s *Store) locked(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn()
}

// wake wakes everyone waiting on s.cond.
func (s *Store) wake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cond.Broadcast()
}

// usableLocked is the error of a wait that must end: the caller's context
// ended, or the spill is poisoned or abandoned.
func (s *Store) usableLocked(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return ctxError(op, err)
	}
	if s.poisoned.Load() || s.abandon {
		return errPoisoned(s.dir, op)
	}
	return nil
}

// testHook calls the test hook at point, if one is set.
func (s *Store) testHook(point, key string) {
	if h := s.hook.Load(); h != nil {
		(*h)(point, key)
	}
}

// wakeOnDone wakes the waits on s.cond when ctx ends; the caller calls the
// returned stop.
func (s *Store) wakeOnDone(ctx context.Context) (stop func() bool) {
	return context.AfterFunc(ctx, s.wake)
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
	defer s.end()
	e, ok := s.lookup(hashKey(key))
	switch {
	case !ok:
		return 0, fmt.Errorf("spill: object %s: %w", key, storage.ErrNotFound)
	case e.format != uint64(format):
		return 0, fmt.Errorf("spill: object %s is stored in format %#x, not %#x: %w (%w)", key, e.format, uint64(format), storage.ErrNotFound, ErrOtherFormat)
	}
	return e.size, nil
}

// lookup returns h's indexed object; one still being put is not there yet.
func (s *Store) lookup(h [16]byte) (entry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.idx.get(h)
	return e, ok && !e.pending
}

// RemoveObject forgets key's object and reports whether there was one: the
// one-key RemoveObjects.
func (s *Store) RemoveObject(ctx context.Context, key string) (bool, error) {
	had, err := s.RemoveObjects(ctx, []string{key})
	if len(had) == 0 {
		return false, err
	}
	return had[0], err
}

// RemoveObjects forgets the objects of keys and reports, key by key, whether
// there was one. For each it appends a tombstone, and it returns once every
// tombstone it appended is written to its segment file (one write of the
// current write buffer for the whole batch, with the pwrite the writer uses,
// O_DIRECT where the filesystem takes it): the objects stay removed after the
// service is killed, even with SIGKILL, though not necessarily after a power
// loss (there is no fsync).
//
// An object that a put is still copying in (placed, not yet readable: in the
// node service, an object being evicted from the arena) is removed too: the
// remove's tombstone follows the put's record, and the put returns success
// with its object removed, after a restart too. A put placed after the
// remove's tombstone stores the key again.
//
// Where a tombstone cannot be written (the device is full or failing, or ctx
// ends first), the object is forgotten all the same, so that no read serves
// it, and the error, which wraps ErrRemoveNotDurable and the cause, says it
// may be back after a restart.
func (s *Store) RemoveObjects(ctx context.Context, keys []string) ([]bool, error) {
	had := make([]bool, len(keys))
	if err := ctx.Err(); err != nil {
		return had, ctxError("remove", err)
	}
	for _, k := range keys {
		if err := checkKey("remove", k); err != nil {
			return had, err
		}
	}
	if len(keys) == 0 {
		return had, nil
	}
	if err := s.admit("remove", fmt.Sprintf("of %d keys", len(keys))); err != nil {
		return had, err
	}
	defer s.end()
	defer s.wakeOnDone(ctx)()
	w := &flushWait{}
	var firstErr error
	failed, removed := 0, 0
	decide := func(_ entry, ok bool) tombAction {
		if ok {
			return tombPlace
		}
		return tombSkip
	}
	for i, k := range keys {
		h := hashKey(k)
		_, forgot, err := s.stageTombstone(ctx, k, h, 0, w, decide, true)
		if err != nil {
			// Forgotten all the same: only a restart could bring it back.
			forgot = s.forget(h, nil)
			if forgot {
				failed++
				if firstErr == nil {
					firstErr = err
				}
			}
		}
		had[i] = forgot
		if forgot {
			removed++
		}
	}
	if err := s.waitWritten(ctx, w, "remove"); err != nil && firstErr == nil {
		firstErr, failed = err, removed
	}
	s.st.removed.Add(int64(removed))
	if firstErr != nil {
		s.st.removesNotDurable.Add(int64(failed))
		s.log.Warn("spill: tombstones of removed objects could not be written; they are removed, but may be back after a restart",
			"dir", s.dir, "objects", failed, "err", firstErr)
		return had, fmt.Errorf("spill %s: remove: the tombstones of up to %d of %d removed objects may not be written (%w): %w; "+
			"they are removed, but may be back after a restart: remove them again once the device has room or works", s.dir, failed, removed, firstErr, ErrRemoveNotDurable)
	}
	return had, nil
}

// forget forgets h's object, or (without want) cancels the put storing it,
// when it is (still) want, and reports whether it did.
func (s *Store) forget(h [16]byte, want *entry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.idx.get(h)
	if !ok || want != nil && e != *want {
		return false
	}
	return s.forgetLocked(h, e)
}

// forgetLocked forgets h, whose entry is e: it unindexes an object, and
// cancels a put still copying (its commit then finds it gone).
func (s *Store) forgetLocked(h [16]byte, e entry) bool {
	if !e.pending {
		return s.unindexLocked(h)
	}
	s.idx.abort(s.idx.find(h))
	s.pendingPuts--
	return true
}

// unindexLocked forgets h, an object (not a pending one), and reports
// whether it was indexed.
func (s *Store) unindexLocked(h [16]byte) bool {
	e, ok := s.idx.remove(h)
	if ok {
		s.deadLocked(e)
	}
	return ok
}

// indexLocked records e, a record in seg, for h, replacing an older entry.
func (s *Store) indexLocked(seg *segment, h [16]byte, e entry) error {
	_, old, replaced, err := s.idx.add(&seg.head, h, e)
	if replaced {
		s.deadLocked(old)
	}
	if err == nil {
		s.liveLocked(seg, e)
	}
	return err
}

// liveLocked counts e, a record in seg, as a live object.
func (s *Store) liveLocked(seg *segment, e entry) {
	n := recLen(e)
	seg.liveRec += n
	s.liveRec += n
	s.liveBytes += e.size
}

// deadLocked counts e as dead, and wakes the compactor when e's segment fell
// below CompactBelow.
func (s *Store) deadLocked(e entry) {
	n := recLen(e)
	s.liveRec -= n
	s.liveBytes -= e.size
	if seg := s.byID[e.seg]; seg != nil {
		seg.liveRec -= n
		seg.compactFailed = false
		s.kickLocked(seg)
	}
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
