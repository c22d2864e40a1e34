package spill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

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
