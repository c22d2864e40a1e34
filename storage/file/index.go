package file

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/storage"
)

// The capacity index: what this process knows of the files in the directory,
// their sizes and when they were last read or written. It is built by a scan at
// New, kept current by this process's puts, gets and removals, and rescanned when
// this process's view passes the capacity and, in the background, once a minute
// while puts come, because other processes write to the same directory. Eviction removes the least recently used files by this view; a
// scanned file's last use is its atime, which every Get touches.

const (
	// staleTempAge is how old a temporary file must be before a scan removes it as
	// the leftover of a crashed writer. A live writer finishes in well under it.
	staleTempAge = 10 * time.Minute
	// defaultRescanEvery is the least time between two rescans, so a store that
	// cannot get under capacity does not walk the directory for every put.
	defaultRescanEvery = time.Second
	// defaultRefreshEvery is how old the last scan may grow before a put starts
	// another in the background. It bounds how far the directory can overshoot the
	// capacity when several processes write to it: each one's view lags the others'
	// writes by at most this much.
	defaultRefreshEvery = time.Minute
	// evictTarget is the fill, in tenths of the capacity, that eviction brings the
	// store down to, so that one eviction pays for many puts.
	evictTarget = 9
)

// fileInfo is the index's entry for one file.
type fileInfo struct {
	size   int64 // bytes on disk, whole blocks
	access int64 // last read or write known, Unix nanoseconds
	seen   int64 // when this process last saw the file exist, Unix nanoseconds
}

// index is the capacity index. Its methods lock mu; the *Locked ones expect it held.
type index struct {
	mu       sync.Mutex
	files    map[string]fileInfo // by path relative to the store's directory
	used     int64               // sum of files' sizes
	pending  int64               // bytes reserved by writes in flight
	capacity int64
	lastScan int64 // when the last scan ended, Unix nanoseconds
}

// noteLocked records that rel exists with size bytes, used at time now.
func (x *index) noteLocked(rel string, size, now int64) {
	f, ok := x.files[rel]
	if ok {
		x.used -= f.size
	}
	f.size, f.access, f.seen = size, max(f.access, now), now
	x.files[rel] = f
	x.used += size
}

func (x *index) note(rel string, size, now int64) {
	x.mu.Lock()
	x.noteLocked(rel, size, now)
	x.mu.Unlock()
}

// forget drops rel, which is no longer on disk.
func (x *index) forget(rel string) {
	x.mu.Lock()
	x.forgetLocked(rel)
	x.mu.Unlock()
}

func (x *index) forgetLocked(rel string) {
	if f, ok := x.files[rel]; ok {
		x.used -= f.size
		delete(x.files, rel)
	}
}

// effectiveLocked is the capacity that counts now: the configured one, or
// less when the device has less room, free bytes, than the capacity leaves.
// The files the index knows are on the device already, so they count on top
// of free; writes in flight take from it.
func (x *index) effectiveLocked(free int64) int64 {
	if free > x.capacity-x.used {
		return x.capacity
	}
	return x.used + free
}

// take reserves size bytes for a write if they fit under the capacity and the
// device's free bytes.
func (x *index) take(size, free int64) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.used+x.pending+size > x.effectiveLocked(free) {
		return false
	}
	x.pending += size
	return true
}

// release returns a reservation of a write that did not happen.
func (x *index) release(size int64) {
	x.mu.Lock()
	x.pending -= size
	x.mu.Unlock()
}

// commit turns a reservation into the file rel.
func (x *index) commit(rel string, size, now int64) {
	x.mu.Lock()
	x.pending -= size
	x.noteLocked(rel, size, now)
	x.mu.Unlock()
}

// usage is the bytes and files the index knows.
func (x *index) usage() (bytes, files int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.used, int64(len(x.files))
}

// evictLocked drops the least recently used files from the index until a write of
// size bytes leaves the store at evictTarget tenths of its capacity, and returns
// them for the caller to remove. A victim's other part goes with it.
func (x *index) evictLocked(size, capacity int64) []string {
	return x.evictDownToLocked(capacity/10*evictTarget - size)
}

// evictDownToLocked drops the least recently used files from the index until
// the bytes stored and being written are at most target, and returns them.
func (x *index) evictDownToLocked(target int64) []string {
	if x.used+x.pending <= target || len(x.files) == 0 {
		return nil
	}
	type aged struct {
		rel    string
		access int64
	}
	all := make([]aged, 0, len(x.files))
	for rel, f := range x.files {
		all = append(all, aged{rel, f.access})
	}
	slices.SortFunc(all, func(a, b aged) int {
		if a.access != b.access {
			return cmpInt64(a.access, b.access)
		}
		return strings.Compare(a.rel, b.rel)
	})
	var victims []string
	for _, a := range all {
		if x.used+x.pending <= target {
			break
		}
		if _, ok := x.files[a.rel]; !ok {
			continue // went with its sibling
		}
		x.forgetLocked(a.rel)
		victims = append(victims, a.rel)
		if sib := sibling(a.rel); sib != "" {
			if _, ok := x.files[sib]; ok {
				x.forgetLocked(sib)
				victims = append(victims, sib)
			}
		}
	}
	return victims
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// mergeLocked folds a scan that started at start into the index: files the scan
// found are added (with their atime as last use, unless this process used them
// later); files it did not find are dropped unless this process saw them after the
// scan began (a write that landed behind the scan's back).
func (x *index) mergeLocked(scanned map[string]fileInfo, start int64) {
	for rel, f := range x.files {
		if _, ok := scanned[rel]; !ok && f.seen < start {
			x.forgetLocked(rel)
		}
	}
	for rel, sf := range scanned {
		f, ok := x.files[rel]
		if ok {
			x.used -= f.size
			f.size, f.access = sf.size, max(f.access, sf.access)
		} else {
			f = sf
		}
		x.files[rel] = f
		x.used += f.size
	}
}

// reserve makes room for a write of size bytes: within the capacity it takes the
// bytes at once; past it, it rescans the directory (other processes write and
// evict too), evicts the least recently used files down to 90% and takes them if
// they then fit.
func (s *Store) reserve(size int64) error {
	x := &s.idx
	if size > x.capacity {
		return fmt.Errorf("file store %s: an object part of %d bytes on disk exceeds the capacity of %d bytes; raise CapacityBytes: %w",
			s.dir, size, x.capacity, storage.ErrNoSpace)
	}
	asked := time.Now().UnixNano()
	if x.take(size, s.deviceFree()) {
		return nil
	}
	s.rescan(asked)
	free := s.deviceFree()
	x.mu.Lock()
	// The capacity by the fresh view, fixed before eviction: the victims' bytes
	// are still on the device, not in free.
	capacity := x.effectiveLocked(free)
	var victims []string
	if x.used+x.pending+size > capacity { // still full by the fresh view (another writer may have evicted)
		victims = x.evictLocked(size, capacity)
	}
	ok := x.used+x.pending+size <= capacity
	if ok {
		x.pending += size
	}
	used, pending := x.used, x.pending
	x.mu.Unlock()
	s.removeFiles(victims)
	if !ok {
		return fmt.Errorf("file store %s: at capacity (%d bytes stored, %d being written, %d more needed) with nothing left to evict: %w",
			s.dir, used, pending, size, storage.ErrNoSpace)
	}
	return nil
}

// deviceFree is the bytes an unprivileged writer may still use on the
// directory's device (statfs f_bavail); a device that cannot say is taken to
// have room for the whole capacity. One statfs per reservation: a few hundred
// nanoseconds next to writing a file.
func (s *Store) deviceFree() int64 {
	if s.freeBytes != nil {
		return s.freeBytes()
	}
	var st unix.Statfs_t
	if err := unix.Statfs(s.dir, &st); err != nil || st.Bsize <= 0 || st.Blocks == 0 {
		return math.MaxInt64 // no answer, or a filesystem without a size (ramfs)
	}
	if st.Bavail > uint64(math.MaxInt64)/uint64(st.Bsize) {
		return math.MaxInt64
	}
	return int64(st.Bavail) * st.Bsize
}

// evictForSpace makes room after the device answered ENOSPC though the index
// thought there was room (other users of the device, metadata, a race with
// the free-space check): it removes the least recently used files, at least
// size bytes and a tenth of what the store holds, and reports whether it
// removed any, so the write is worth retrying once.
func (s *Store) evictForSpace(size int64) bool {
	x := &s.idx
	x.mu.Lock()
	victims := x.evictDownToLocked(x.used + x.pending - max(size, x.used/10))
	x.mu.Unlock()
	s.removeFiles(victims)
	return len(victims) > 0
}

// removeFiles unlinks evicted files. A file already gone (another process evicted
// it) is fine; one that cannot be removed comes back with the next scan.
func (s *Store) removeFiles(rels []string) {
	for _, rel := range rels {
		err := retryEINTR(func() error { return unix.Unlink(filepath.Join(s.dir, rel)) })
		if err == nil || err == unix.ENOENT {
			s.stats.evictions.Add(1)
		}
	}
}

// rescan refreshes the index from the directory for a reservation that found the
// store full at time asked. Scans run one at a time; a reservation that finds one
// running waits for it and uses its result, so concurrent writers never evict by a
// view that is about to change. Rescans are at most rescanEvery apart.
func (s *Store) rescan(asked int64) {
	s.scanMu.Lock()
	defer s.scanMu.Unlock()
	s.idx.mu.Lock()
	last := s.idx.lastScan
	s.idx.mu.Unlock()
	if last >= asked || time.Now().UnixNano()-last < int64(s.rescanEvery) {
		return
	}
	s.runScan()
}

// refresh rescans in the background when the last scan is older than
// refreshEvery, so that this process's view follows the other writers' files even
// while its own writes stay under the capacity. The scan counts as a call in
// flight, so Close waits for it.
func (s *Store) refresh() {
	s.idx.mu.Lock()
	due := time.Now().UnixNano()-s.idx.lastScan >= int64(s.refreshEvery)
	s.idx.mu.Unlock()
	if !due || !s.scanMu.TryLock() {
		return
	}
	s.inflight.Add(1)
	go func() {
		defer s.inflight.Done()
		defer s.scanMu.Unlock()
		s.runScan()
	}()
}

// runScan scans the directory and folds the result into the index. The caller
// holds scanMu.
func (s *Store) runScan() {
	start := time.Now().UnixNano()
	scanned := s.scan()
	x := &s.idx
	x.mu.Lock()
	x.mergeLocked(scanned, start)
	x.lastScan = time.Now().UnixNano()
	x.mu.Unlock()
	s.stats.rescans.Add(1)
}

// scan lists every object file under the directory with its size and last use, and
// removes temporary files older than staleTempAge. Errors leave entries out: a scan
// is a best effort, and a directory it cannot read holds nothing it could evict.
func (s *Store) scan() map[string]fileInfo {
	names, _ := readDirNames(s.dir)
	var subdirs []string
	for _, n := range names {
		switch {
		case isFanout(n):
			subdirs = append(subdirs, n)
		case strings.HasPrefix(n, tempPrefix):
			s.removeIfStale(s.dir, n)
		}
	}
	out := make(map[string]fileInfo)
	var (
		mu   sync.Mutex
		next atomic.Int64
		wg   sync.WaitGroup
	)
	work := func() {
		for {
			i := int(next.Add(1) - 1)
			if i >= len(subdirs) {
				return
			}
			sub := subdirs[i]
			dir := filepath.Join(s.dir, sub)
			files, _ := readDirNames(dir)
			for _, n := range files {
				if strings.HasPrefix(n, tempPrefix) {
					s.removeIfStale(dir, n)
					continue
				}
				var st unix.Stat_t
				if err := unix.Lstat(filepath.Join(dir, n), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
					continue
				}
				f := fileInfo{size: roundUp(st.Size, blockSize), access: max(st.Atim.Nano(), st.Mtim.Nano())}
				mu.Lock()
				out[sub+"/"+n] = f
				mu.Unlock()
			}
		}
	}
	for w := 1; w < min(s.cfg.IOWorkers, len(subdirs)); w++ {
		wg.Go(work)
	}
	work()
	wg.Wait()
	return out
}

// removeIfStale removes the temporary file dir/name if its writer has been gone
// for staleTempAge.
func (s *Store) removeIfStale(dir, name string) {
	var st unix.Stat_t
	path := filepath.Join(dir, name)
	if err := unix.Lstat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return
	}
	if time.Since(time.Unix(0, st.Mtim.Nano())) < staleTempAge {
		return
	}
	if err := unix.Unlink(path); err == nil {
		s.stats.staleTemps.Add(1)
	}
}

// isFanout reports whether n names one of the 256 subdirectories: two lowercase
// hex digits.
func isFanout(n string) bool {
	return len(n) == 2 && isHex(n[0]) && isHex(n[1])
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' }

// readDirNames lists dir without sorting it.
func readDirNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}
