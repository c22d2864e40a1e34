// Package file stores L3 objects as files in one directory, for a local SSD.
//
// Each object part (a page's K or V, or its MLA latent) is one file, named as
// SGLang's Mooncake store names the object (storage.ObjectNames) and placed in the
// subdirectory named by the page key's first two hex digits. A file is a 4 KiB
// header (magic, version, body length, the pool's storage.Format, checksums of the
// body and of the header) followed by the body, so that with O_DIRECT the body
// moves between the device and the host pool without a copy. Bodies are read and
// written straight from and to the registered host pool (preadv/pwritev over the
// page's runs); only unaligned edges under O_DIRECT go through a bounce buffer.
//
// Several processes, and several Stores in one process, may share a directory:
// a put writes a temporary file and renames it into place without replacing
// (renameat2 RENAME_NOREPLACE), so readers only ever see whole files and the first
// writer of a key wins. A file that fails its checks (torn by a crash without
// Sync, flipped bits) is a miss, never served, and is removed. Each process bounds
// the directory to CapacityBytes by its own view of it, refreshed from disk when
// that view fills up, and evicts the least recently used files first.
package file

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/storage"
)

// Store is a storage.Backend over a directory. It is safe for concurrent use.
type Store struct {
	cfg         Config
	dir         string
	log         *slog.Logger
	pid         string
	rescanEvery time.Duration
	// refreshEvery is how old the last scan may grow before a put starts another.
	refreshEvery time.Duration
	// freeBytes, when set, replaces the device's free space (statfs) for tests
	// that make the device fill up behind the index's back.
	freeBytes func() int64

	mu       sync.RWMutex // guards pools and closed
	pools    map[string]*poolState
	closed   bool
	inflight sync.WaitGroup

	direct atomic.Bool // O_DIRECT in use: Config.DirectIO until the filesystem refuses it
	idx    index
	scanMu sync.Mutex // held by the one scan that runs at a time
	stats  counters
	bufs   sync.Pool // *ioBuf
}

var _ storage.Backend = (*Store)(nil)

// objSpec is what an object part file must be: its format, body length and file length.
type objSpec struct {
	format   storage.Format
	bodyLen  int64
	fileSize int64
}

func newObjSpec(format storage.Format, bodyLen int64) objSpec {
	return objSpec{format: format, bodyLen: bodyLen, fileSize: headerSize + bodyLen}
}

// poolState is a registered pool.
type poolState struct {
	spec      storage.PoolSpec
	names     pagekey.Names // spec.Names with MLA from the layout
	format    storage.Format
	parts     int   // object parts per page
	partBytes int64 // body bytes of one part
	fileSize  int64 // length of one part's file
	// readOnly says why puts are impossible (the directory is not writable), nil
	// when they are possible.
	readOnly error
}

func (ps *poolState) obj() objSpec {
	return objSpec{format: ps.format, bodyLen: ps.partBytes, fileSize: ps.fileSize}
}

// New opens (or creates) the store described by cfg, and scans its directory to
// learn what it holds, removing temporary files that crashed writers left behind.
// A directory that exists but cannot be written is a read-only store.
func New(cfg Config) (*Store, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("file store %s: %w: %w", cfg.Dir, err, storage.ErrConfig)
	}
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, fmt.Errorf("file store: cannot create directory %s: %w; create it, or choose a directory this process can write (strata bench --l3-dir, strata serve --spill-dir): %w",
			dir, err, storage.ErrConfig)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("file store: %s is not a usable directory (%v): %w", dir, err, storage.ErrConfig)
	}
	s := &Store{
		cfg:          cfg,
		dir:          dir,
		log:          cfg.Logger,
		pid:          strconv.Itoa(os.Getpid()),
		rescanEvery:  defaultRescanEvery,
		refreshEvery: defaultRefreshEvery,
		pools:        make(map[string]*poolState),
		idx:          index{files: make(map[string]fileInfo), capacity: cfg.CapacityBytes},
	}
	s.bufs.New = func() any { return newIOBuf() }
	s.direct.Store(cfg.DirectIO)
	start := time.Now().UnixNano()
	scanned := s.scan()
	s.idx.mu.Lock()
	s.idx.mergeLocked(scanned, start)
	s.idx.lastScan = time.Now().UnixNano()
	used := s.idx.used
	s.idx.mu.Unlock()
	if n := s.stats.staleTemps.Load(); n > 0 {
		s.log.Info("file store: removed temporary files of crashed writers", "dir", dir, "files", n)
	}
	if used > cfg.CapacityBytes {
		s.log.Info("file store: directory holds more than the capacity; the least recently used objects go with the next puts",
			"dir", dir, "bytes", used, "capacity", cfg.CapacityBytes)
	}
	return s, nil
}

// Name is "file".
func (s *Store) Name() string { return "file" }

// Dir is the store's directory, as an absolute path.
func (s *Store) Dir() string { return s.dir }

// Allocator is "": files are read and written from any host memory.
func (s *Store) Allocator() hostmem.Kind { return "" }

// RegisterPool checks spec and makes the pool available to Exists, Get and Put. It
// probes that the directory is writable; when it is not, the pool is registered
// for reading only (a read-only L3 is legitimate: Get and Exists work, Put fails
// with storage.ErrNotRegistered) and the error, wrapping storage.ErrRegistration,
// says what to fix. Registering a name again replaces the earlier registration.
func (s *Store) RegisterPool(ctx context.Context, spec storage.PoolSpec) error {
	if err := ctx.Err(); err != nil {
		return ctxError("register pool "+spec.Name, err)
	}
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("file store %s: register: %w", s.dir, err)
	}
	if err := checkNames(spec); err != nil {
		return fmt.Errorf("file store %s: register: %w", s.dir, err)
	}
	names := spec.Names
	names.MLA = spec.Layout.Geometry.MLA
	ps := &poolState{
		spec:      spec,
		names:     names,
		format:    storage.FormatOf(spec.Layout),
		parts:     spec.Layout.Geometry.Buffers(),
		partBytes: spec.Layout.PageBufferBytes(),
	}
	ps.fileSize = headerSize + ps.partBytes
	if s.isClosed() {
		return fmt.Errorf("file store %s: register pool %q: %w", s.dir, spec.Name, storage.ErrClosed)
	}
	ps.readOnly = s.probeWritable()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("file store %s: register pool %q: %w", s.dir, spec.Name, storage.ErrClosed)
	}
	s.pools[spec.Name] = ps
	s.mu.Unlock()
	if ps.readOnly != nil {
		return fmt.Errorf("file store: pool %q: %w; the pool can read the objects already there (Get, Exists) but cannot store any: %w",
			spec.Name, ps.readOnly, storage.ErrRegistration)
	}
	return nil
}

// probeWritable creates and removes a file in the directory. It also finds out
// early whether the filesystem takes O_DIRECT.
func (s *Store) probeWritable() error {
	path := filepath.Join(s.dir, s.tempName("probe"))
	fd, _, err := s.open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o666)
	if err != nil {
		if err == unix.EACCES || err == unix.EPERM || err == unix.EROFS {
			return fmt.Errorf("directory %s is not writable (%w): mount it read-write and give this process's user write permission, or choose a writable directory (strata bench --l3-dir, strata serve --spill-dir)",
				s.dir, err)
		}
		return fmt.Errorf("cannot create a file in directory %s (%w)", s.dir, err)
	}
	_ = unix.Close(fd)
	_ = unix.Unlink(path)
	return nil
}

// Close makes later calls fail with storage.ErrClosed and waits for the calls in
// flight. It holds no other resources; closing twice is fine.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.inflight.Wait()
	return nil
}

func (s *Store) isClosed() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.closed
}

// ctxError is the per-key error of a call whose context ended: it wraps the
// context's error, and storage.ErrTimeout for a deadline.
func ctxError(op string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("file store: %s: %w: %w", op, err, storage.ErrTimeout)
	}
	return fmt.Errorf("file store: %s: %w", op, err)
}

// path is the absolute path of rel.
func (s *Store) path(rel string) string { return s.dir + "/" + rel }

// tempName is a fresh temporary file name for object name: unique per process and
// call, and recognisable to scans by its prefix.
func (s *Store) tempName(name string) string {
	var r [8]byte
	for i, v := 0, rand.Uint64(); i < len(r); i, v = i+1, v>>8 {
		r[i] = byte(v)
	}
	return tempPrefix + name + "-" + s.pid + "-" + hex.EncodeToString(r[:])
}
