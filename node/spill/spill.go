package spill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/internal/undo"
	"github.com/stratakv/strata/storage"
)

// Store is a spill directory of segment files. It is safe for concurrent use.
type Store struct {
	dirfd    int // the directory, which every file name is relative to (dir.go)
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

	compactKick    chan struct{}      // a segment may have fallen below CompactBelow
	compactCtx     context.Context    // ends when Close stops compaction
	compactCancel  context.CancelFunc // ends compactCtx
	compactor      sync.WaitGroup     // the compactor goroutine
	compactStarted bool               // StartCompaction ran; under mu
	pacer          pacer              // compaction's bytes per second; used by the one compaction in flight

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
	// firstNew is the first segment id of this run. While scanning, an
	// earlier run's segments are being indexed (scan.go): their entries are
	// hidden, and shadow holds the keys removed meanwhile.
	firstNew uint32
	scanning bool
	shadow   map[[16]byte]struct{}

	scan scanState
	st   counters
}

// New opens (or creates) the spill in cfg.Dir, a directory private to this
// user, opens the segment files there and starts its writer; it returns once
// their objects are indexed, or at once with Config.ScanInBackground.
func New(cfg Config) (_ *Store, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("spill %s: %w: %w", cfg.Dir, err, storage.ErrConfig)
	}
	// What New creates is removed when it fails, and handed to cfg.Undo
	// when it does not.
	var made undo.Log
	defer func() {
		if err != nil {
			_ = made.Undo()
		} else if cfg.Undo != nil {
			cfg.Undo.Append(&made)
		}
	}()
	dirfd, tightened, err := openDir(dir, &made)
	if err != nil {
		return nil, err
	}
	if tightened != 0 {
		cfg.Logger.Warn("spill: the directory was readable by the group or others and held only the spill's files; it is now private (mode 0700)",
			"dir", dir, "was", fmt.Sprintf("%04o", tightened))
	}
	s := &Store{
		dirfd:    dirfd,
		lock:     -1,
		cfg:      cfg,
		dir:      dir,
		log:      cfg.Logger,
		bufBytes: cfg.BufferBytes,
		direct:   cfg.DirectIO,
		byID:     map[uint32]*segment{},
		nextID:   1,
	}
	fixed, err := s.lockDir(&made)
	if err != nil {
		_ = unix.Close(dirfd)
		return nil, err
	}
	s.dioAlign, s.dioMem = dioAlignment(s.lock, cfg.DirectIO)
	s.cond = sync.NewCond(&s.mu)
	fail := func(err error) (*Store, error) {
		s.closeSegments()
		s.idx.close()
		_ = unix.Close(s.lock)
		_ = unix.Close(dirfd)
		return nil, err
	}
	if s.idx, err = newIndex(); err != nil {
		return fail(err)
	}
	if err := s.openSegments(fixed); err != nil {
		return fail(err)
	}
	// Lowered for a small spill (or a small device), so that dropping the
	// oldest segment frees an eighth of it, not all of it.
	capacity := min(cfg.CapacityBytes, s.used+s.deviceFree())
	s.segBytes = min(cfg.SegmentBytes, max(roundDown(capacity/8, block), minSegment))
	s.refreshLimitLocked()
	mem, err := unix.Mmap(-1, 0, int(2*s.bufBytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fail(fmt.Errorf("spill %s: mapping two write buffers of %d bytes: %v: %w", dir, s.bufBytes, err, storage.ErrConfig))
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
	}
	s.startScan()
	if !cfg.DeferCompaction {
		s.StartCompaction()
	}
	if !cfg.ScanInBackground {
		<-s.scan.ready
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
	s.stopScan()
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
	_ = unix.Close(s.dirfd)
	if s.poisoned.Load() {
		err = errors.Join(err, fmt.Errorf("spill %s: a call panicked (a bug: see the log); closed without writing the %d bytes still buffered, which are lost: %w",
			s.dir, lost, storage.ErrIO))
	}
	return err
}

// StartCompaction starts the compactor (Config.CompactBelow) of a store
// opened with Config.DeferCompaction; New starts it otherwise. Once is
// enough; after Close it does nothing.
func (s *Store) StartCompaction() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.compactKick == nil || s.compactStarted {
		return
	}
	s.compactStarted = true
	s.compactor.Add(1)
	go s.compactLoop()
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
