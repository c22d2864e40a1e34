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
	"io"
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
	"github.com/stratakv/strata/internal/vecio"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
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

// Exists reports how many of keys, from the start, have every part of their object
// stored in the pool's format. It reads each part's header; a corrupt one is
// removed and counts as missing.
func (s *Store) Exists(ctx context.Context, poolName string, keys []pagekey.Key) (int, error) {
	ps, done, err := s.begin(poolName, "exists")
	if err != nil {
		s.stats.fault(err)
		return 0, err
	}
	defer done()
	if err := storage.CheckKeys(keys); err != nil {
		err = fmt.Errorf("file store: exists in pool %q: %w", poolName, err)
		s.stats.fault(err)
		return 0, err
	}
	n := len(keys)
	var firstMiss atomic.Int64
	firstMiss.Store(int64(n))
	missAt := func(i int) {
		for {
			cur := firstMiss.Load()
			if int64(i) >= cur || firstMiss.CompareAndSwap(cur, int64(i)) {
				return
			}
		}
	}
	found := make([]bool, n)
	errs := s.parallel(ctx, "exists", n, func(i int, b *ioBuf) error {
		if int64(i) > firstMiss.Load() {
			return nil // past a miss: the answer does not depend on it
		}
		for part := 0; part < ps.parts; part++ {
			name := ps.names.Object(keys[i], ps.spec.Name, part)
			rel := relPath(keys[i], name)
			have, err := s.probe(ps.obj(), rel, name, b)
			if err != nil || have != stored {
				missAt(i)
				return err
			}
		}
		found[i] = true
		return nil
	})
	for i := 0; i < n; i++ {
		if errs[i] != nil {
			s.stats.fault(errs[i])
			return i, errs[i]
		}
		if !found[i] {
			return i, nil
		}
	}
	return n, nil
}

// Get reads the objects of keys into the pool's pages: every part is opened, its
// header checked, its body read straight into the page's runs and its checksum
// verified over the bytes now in host memory. A part of another format is
// storage.ErrNotFound and stays; a part that fails a check is storage.ErrCorrupt
// and is removed.
func (s *Store) Get(ctx context.Context, poolName string, keys []pagekey.Key, pages []pool.PageID) []error {
	ps, done, err := s.begin(poolName, "get")
	if err != nil {
		return s.failAll(len(keys), err)
	}
	defer done()
	if err := storage.CheckBatch(ps.spec, keys, pages); err != nil {
		return s.failAll(len(keys), fmt.Errorf("file store: get from pool %q: %w", poolName, err))
	}
	mem := ps.spec.Region.Bytes()
	errs := s.parallel(ctx, "get", len(keys)*ps.parts, func(i int, b *ioBuf) error {
		k, part := i/ps.parts, i%ps.parts
		return s.getPart(ps, keys[k], pages[k], part, mem, b)
	})
	return s.perKey(errs, len(keys), ps.parts)
}

// Put writes the pool's pages as the objects of keys, write-once: a part already
// stored (in any format) is left as it is and counts as a success.
func (s *Store) Put(ctx context.Context, poolName string, keys []pagekey.Key, pages []pool.PageID) []error {
	ps, done, err := s.begin(poolName, "put")
	if err != nil {
		return s.failAll(len(keys), err)
	}
	defer done()
	if ps.readOnly != nil {
		return s.failAll(len(keys), fmt.Errorf("file store: put to pool %q: %v; its registration failed: %w", poolName, ps.readOnly, storage.ErrNotRegistered))
	}
	if err := storage.CheckBatch(ps.spec, keys, pages); err != nil {
		return s.failAll(len(keys), fmt.Errorf("file store: put to pool %q: %w", poolName, err))
	}
	s.refresh()
	mem := ps.spec.Region.Bytes()
	// Renames are made durable once per subdirectory per batch rather than once per
	// object: a directory fsync costs about what a whole 4 MiB object write does.
	dirty := make([]string, len(keys)*ps.parts)
	errs := s.parallel(ctx, "put", len(keys)*ps.parts, func(i int, b *ioBuf) error {
		k, part := i/ps.parts, i%ps.parts
		var err error
		dirty[i], err = s.putPart(ps, keys[k], pages[k], part, mem, b)
		return err
	})
	if s.cfg.Sync {
		s.syncDirs(ctx, dirty, errs)
	}
	return s.perKey(errs, len(keys), ps.parts)
}

// syncDirs makes the renames of a put durable: each subdirectory in dirty
// (that of a part written without error) is fsynced once, and the part's error
// becomes that sync's. The syncs run on the I/O workers at once: one at a time,
// a batch of 128 random keys syncs about 100 subdirectories in a row, each a
// journal commit, which cost a fifth of the put's time; at once, the file
// system commits them together.
func (s *Store) syncDirs(ctx context.Context, dirty []string, errs []error) {
	at := map[string]int{}
	var subs []string
	for i, sub := range dirty {
		if sub == "" || errs[i] != nil {
			continue
		}
		if _, ok := at[sub]; !ok {
			at[sub] = len(subs)
			subs = append(subs, sub)
		}
	}
	synced := s.parallel(ctx, "put", len(subs), func(i int, _ *ioBuf) error {
		if err := syncDir(subs[i]); err != nil {
			return ioError("sync directory", subs[i], err)
		}
		return nil
	})
	for i, sub := range dirty {
		if sub != "" && errs[i] == nil {
			errs[i] = synced[at[sub]]
		}
	}
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

// begin admits a call on poolName: the store is open and the pool registered with
// live memory. The caller calls done when the call ends.
func (s *Store) begin(poolName, op string) (ps *poolState, done func(), err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, nil, fmt.Errorf("file store %s: %s: %w", s.dir, op, storage.ErrClosed)
	}
	ps = s.pools[poolName]
	if ps == nil {
		return nil, nil, fmt.Errorf("file store %s: %s on pool %q, which is not registered; call RegisterPool first: %w",
			s.dir, op, poolName, storage.ErrNotRegistered)
	}
	if ps.spec.Region.Closed() {
		return nil, nil, fmt.Errorf("file store %s: %s on pool %q, whose memory region was closed; register the pool's new memory: %w",
			s.dir, op, poolName, storage.ErrNotRegistered)
	}
	s.inflight.Add(1)
	return ps, s.inflight.Done, nil
}

// parallel runs fn for items 0..n-1 on up to IOWorkers goroutines, each with its
// own scratch buffers, checking ctx before each item.
func (s *Store) parallel(ctx context.Context, op string, n int, fn func(i int, b *ioBuf) error) []error {
	errs := make([]error, n)
	var next atomic.Int64
	work := func() {
		b := s.bufs.Get().(*ioBuf)
		defer s.bufs.Put(b)
		for {
			i := int(next.Add(1) - 1)
			if i >= n {
				return
			}
			if err := ctx.Err(); err != nil {
				errs[i] = ctxError(op, err)
				continue
			}
			errs[i] = fn(i, b)
		}
	}
	var wg sync.WaitGroup
	for w := 1; w < min(s.cfg.IOWorkers, n); w++ {
		wg.Go(work)
	}
	work()
	wg.Wait()
	return errs
}

// perKey folds the results of each key's parts into one: a fault outranks a miss.
func (s *Store) perKey(partErrs []error, keys, parts int) []error {
	out := make([]error, keys)
	for i, err := range partErrs {
		k := i / parts
		if out[k] == nil || (err != nil && errors.Is(out[k], storage.ErrNotFound) && !errors.Is(err, storage.ErrNotFound)) {
			out[k] = err
		}
	}
	s.stats.faultAll(out)
	return out
}

func (s *Store) failAll(n int, err error) []error {
	out := storage.FailAll(n, err)
	s.stats.faultAll(out)
	return out
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

// open opens path, with O_DIRECT while the store uses it. A filesystem that
// refuses O_DIRECT (EINVAL) turns it off for the store, with one log line. The
// result says whether the descriptor is direct.
func (s *Store) open(path string, flags int, mode uint32) (fd int, direct bool, err error) {
	flags |= unix.O_CLOEXEC
	if s.direct.Load() {
		fd, err = vecio.Open(path, flags|unix.O_DIRECT, mode)
		if err != unix.EINVAL {
			return fd, err == nil, err
		}
		if flags&unix.O_CREAT != 0 {
			// Linux creates the file before it refuses the flag; the name is ours.
			_ = unix.Unlink(path)
		}
		s.directRefused(path, err)
	}
	fd, err = vecio.Open(path, flags, mode)
	return fd, false, err
}

// directRefused turns O_DIRECT off for the store, logging the first time.
func (s *Store) directRefused(path string, err error) {
	if s.direct.CompareAndSwap(true, false) {
		s.log.Warn("file store: the filesystem refuses O_DIRECT; using buffered I/O", "dir", s.dir, "file", path, "err", err)
	}
}

// clearDirect switches fd to buffered I/O.
func clearDirect(fd int) error {
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags&^unix.O_DIRECT)
	return err
}

// presence is what a probe found under an object part's name.
type presence uint8

const (
	absent  presence = iota // no file (or a corrupt one, now removed)
	stored                  // a sound header of the pool's format and the right length
	foreign                 // a sound header of another format
)

// probe reads the header of an object part file and says whether it holds the
// part in the pool's format. A corrupt file is removed and is absent.
func (s *Store) probe(o objSpec, rel, name string, b *ioBuf) (presence, error) {
	path := s.path(rel)
	fd, err := vecio.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		s.idx.forget(rel)
		return absent, nil
	}
	if err != nil {
		return absent, ioError("open", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return absent, ioError("stat", path, err)
	}
	n, err := preadAt(fd, b.hdr, 0)
	if err != nil {
		return absent, ioError("read", path, err)
	}
	h, err := decodeHeader(b.hdr[:n])
	switch {
	case err != nil:
		_ = s.corrupt(path, rel, &st, err.Error())
		return absent, nil
	case h.format != o.format:
		return foreign, nil
	case h.name == name && h.bodyLen != uint64(o.bodyLen) && st.Size == headerSize+int64(h.bodyLen):
		return foreign, nil // a sound object of another length: leave it
	case h.name != name || h.bodyLen != uint64(o.bodyLen) || st.Size != o.fileSize:
		_ = s.corrupt(path, rel, &st, fmt.Sprintf("header of %q with a body of %d bytes in a file of %d bytes, want %q, %d and %d",
			h.name, h.bodyLen, st.Size, name, o.bodyLen, o.fileSize))
		return absent, nil
	}
	s.idx.note(rel, fileBytes(o.bodyLen), st.Atim.Nano())
	return stored, nil
}

// preadAt reads up to len(buf) bytes at off, stopping early only at the end of the file.
func preadAt(fd int, buf []byte, off int64) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := unix.Pread(fd, buf[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		if m == 0 {
			break
		}
		n += m
	}
	return n, nil
}

// corrupt removes a file that failed its checks (if it is still the file that was
// checked) and returns the per-key error.
func (s *Store) corrupt(path, rel string, st *unix.Stat_t, reason string) error {
	s.idx.forget(rel)
	var now unix.Stat_t
	if err := unix.Lstat(path, &now); err != nil || now.Ino != st.Ino || now.Dev != st.Dev {
		return fmt.Errorf("file store: object %s: %s; already replaced or removed: %w", path, reason, storage.ErrCorrupt)
	}
	if err := unix.Unlink(path); err != nil && err != unix.ENOENT {
		return fmt.Errorf("file store: object %s: %s; cannot remove it (%v): %w", path, reason, err, storage.ErrCorrupt)
	}
	s.stats.corrupt.Add(1)
	return fmt.Errorf("file store: object %s: %s; removed it: %w", path, reason, storage.ErrCorrupt)
}

// getPart reads one object part into host memory and verifies it.
func (s *Store) getPart(ps *poolState, key pagekey.Key, page pool.PageID, part int, mem []byte, b *ioBuf) error {
	name := ps.names.Object(key, ps.spec.Name, part)
	b.body.setSpan(mem, ps.spec.Layout.PageBufferSpan(part, int(page)))
	return s.readObj(ps.obj(), relPath(key, name), name, b)
}

// readObj reads the object part at rel into b.body (already pointing at its runs)
// and verifies it.
func (s *Store) readObj(o objSpec, rel, name string, b *ioBuf) error {
	path := s.path(rel)
	fd, direct, err := s.open(path, unix.O_RDONLY, 0)
	if err == unix.ENOENT {
		s.idx.forget(rel)
		s.stats.misses.Add(1)
		return fmt.Errorf("file store: object %s: %w", name, storage.ErrNotFound)
	}
	if err != nil {
		return ioError("open", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return ioError("stat", path, err)
	}
	if st.Size != o.fileSize {
		return s.wrongLength(o, fd, path, rel, name, &st, b)
	}
	err = readFile(fd, b, st.Size, direct)
	if direct && err == unix.EINVAL {
		s.directRefused(path, err)
		if err = clearDirect(fd); err == nil {
			err = readFile(fd, b, st.Size, false)
		}
	}
	if err == io.ErrUnexpectedEOF {
		return s.corrupt(path, rel, &st, "file ends early")
	}
	if err != nil {
		return ioError("read", path, err)
	}
	h, err := decodeHeader(b.hdr)
	switch {
	case err != nil:
		return s.corrupt(path, rel, &st, err.Error())
	case h.format != o.format:
		s.stats.misses.Add(1)
		return fmt.Errorf("file store: object %s is stored in another format (another layout, geometry or page size): %w", name, storage.ErrNotFound)
	case h.name != name:
		return s.corrupt(path, rel, &st, fmt.Sprintf("header names object %q", h.name))
	case h.bodyLen != uint64(o.bodyLen):
		return s.corrupt(path, rel, &st, fmt.Sprintf("header says %d body bytes, want %d", h.bodyLen, o.bodyLen))
	case b.body.sum() != h.bodySum:
		return s.corrupt(path, rel, &st, "body checksum mismatch")
	}
	s.touch(path, &st)
	s.idx.note(rel, fileBytes(o.bodyLen), time.Now().UnixNano())
	s.stats.reads.Add(1)
	s.stats.readBytes.Add(o.bodyLen)
	return nil
}

// wrongLength judges a file whose length is not the part's: another format's
// object is a miss and stays, anything else is corrupt.
func (s *Store) wrongLength(o objSpec, fd int, path, rel, name string, st *unix.Stat_t, b *ioBuf) error {
	n, err := preadAt(fd, b.hdr, 0)
	if err == unix.EINVAL {
		// A direct descriptor: the header block is aligned, so this is a refusal.
		s.directRefused(path, err)
		if err = clearDirect(fd); err == nil {
			n, err = preadAt(fd, b.hdr, 0)
		}
	}
	if err != nil {
		return ioError("read", path, err)
	}
	h, err := decodeHeader(b.hdr[:n])
	if err != nil {
		return s.corrupt(path, rel, st, fmt.Sprintf("file of %d bytes: %v", st.Size, err))
	}
	if h.format != o.format {
		s.stats.misses.Add(1)
		return fmt.Errorf("file store: object %s is stored in another format (another layout, geometry or page size): %w", name, storage.ErrNotFound)
	}
	if h.name == name && st.Size == headerSize+int64(h.bodyLen) {
		// A sound object of another length: the caller asked for the wrong size (a
		// pool's format fixes the length, so only the object API can get here).
		return fmt.Errorf("file store: object %s holds %d bytes, %d were asked for: %w", name, h.bodyLen, o.bodyLen, storage.ErrBatch)
	}
	return s.corrupt(path, rel, st, fmt.Sprintf("file of %d bytes, want %d", st.Size, o.fileSize))
}

// touchEvery is how stale a file's atime must be before a read refreshes it: LRU
// across processes needs no finer grain, and hot objects then cost no inode write
// per read.
const touchEvery = time.Second

// touch marks path as read now (atime only), so that other processes' scans see
// the use. Errors do not matter: the file may have been evicted meanwhile, or the
// directory be read-only.
func (s *Store) touch(path string, st *unix.Stat_t) {
	if time.Since(time.Unix(0, st.Atim.Nano())) < touchEvery {
		return
	}
	ts := []unix.Timespec{{Nsec: unix.UTIME_NOW}, {Nsec: unix.UTIME_OMIT}}
	_ = unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, 0)
}

// putPart writes one object part, unless it is already stored, and returns the
// subdirectory whose entry it renamed into place (to be synced before the put
// reports success), or "".
func (s *Store) putPart(ps *poolState, key pagekey.Key, page pool.PageID, part int, mem []byte, b *ioBuf) (string, error) {
	name := ps.names.Object(key, ps.spec.Name, part)
	b.body.setSpan(mem, ps.spec.Layout.PageBufferSpan(part, int(page)))
	return s.writeObj(ps.obj(), relPath(key, name), name, b)
}

// writeObj stores b.body (already pointing at its runs) as the object part at rel,
// write-once, and returns the subdirectory to sync, or "" when nothing was renamed.
func (s *Store) writeObj(o objSpec, rel, name string, b *ioBuf) (string, error) {
	switch have, err := s.probe(o, rel, name, b); {
	case err != nil:
		return "", err
	case have == stored:
		s.stats.skipped.Add(1)
		return "", nil
	case have == foreign:
		s.stats.conflicts.Add(1)
		return "", nil
	}
	size := fileBytes(o.bodyLen)
	if err := s.reserve(size); err != nil {
		return "", err
	}
	committed := false
	defer func() {
		if !committed {
			s.idx.release(size)
		}
	}()
	header{bodyLen: uint64(o.bodyLen), format: o.format, bodySum: b.body.sum(), name: name}.encode(b.hdr)

	path := s.path(rel)
	sub := s.path(rel[:2])
	tmp := sub + "/" + s.tempName(rel[3:]) // rel is "xx/<file name>"
	fd, direct, err := s.open(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o666)
	if err == unix.ENOENT {
		if err = os.MkdirAll(sub, 0o777); err == nil {
			fd, direct, err = s.open(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o666)
		}
	}
	if err != nil {
		return "", ioError("create", tmp, err)
	}
	renamed := false
	defer func() {
		if !renamed {
			_ = unix.Unlink(tmp)
		}
	}()
	err = writeFile(fd, b, direct)
	if direct && err == unix.EINVAL {
		s.directRefused(tmp, err)
		if err = clearDirect(fd); err == nil {
			if err = unix.Ftruncate(fd, 0); err == nil {
				err = writeFile(fd, b, false)
			}
		}
	}
	if err == nil && s.cfg.Sync {
		err = retryEINTR(func() error { return unix.Fdatasync(fd) })
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err != nil {
		return "", ioError("write", tmp, err)
	}
	switch err := renameNoReplace(tmp, path); {
	case err == unix.EEXIST:
		// Another writer stored the part first; theirs stands.
		s.stats.skipped.Add(1)
		s.idx.commit(rel, size, time.Now().UnixNano())
		committed = true
		return "", nil
	case err != nil:
		return "", ioError("rename", tmp, err)
	}
	renamed = true
	s.idx.commit(rel, size, time.Now().UnixNano())
	committed = true
	s.stats.writes.Add(1)
	s.stats.writeBytes.Add(o.bodyLen)
	return sub, nil
}

// renameNoReplace moves from to to unless to exists (EEXIST). Filesystems without
// RENAME_NOREPLACE get the same guarantee from link, which never replaces.
func renameNoReplace(from, to string) error {
	err := retryEINTR(func() error { return unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE) })
	if err != unix.EINVAL && err != unix.ENOSYS {
		return err
	}
	if err = unix.Link(from, to); err != nil {
		return err
	}
	_ = unix.Unlink(from)
	return nil
}

// syncDir flushes directory dir, so that a rename in it survives a crash.
func syncDir(dir string) error {
	fd, err := vecio.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return retryEINTR(func() error { return unix.Fsync(fd) })
}
