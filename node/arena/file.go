package arena

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/hostmem"
)

// The arena's memory: a header (the superblock and the unit map, layout.go)
// and the data region objects live in, either one mapping of an arena file on
// tmpfs, hugetlbfs or ramfs (shared, so that it outlives the process), or
// anonymous memory laid out the same way.
//
// The file's layout:
//
//	[0, 4096)            two copies of the superblock (at 0 and 2048), the
//	                     newer valid one wins, so that a kill while one is
//	                     written leaves the other
//	[4096, +4/unit)      the unit map
//	[logOff, +8 MiB)     the eviction log (evictlog.go), page aligned
//	[dataOff, fileSize)  the data region, dataOff a multiple of the data's
//	                     alignment (2 MiB or the huge page, at least a unit)
//
// A file is reused only when its superblock is valid and describes the same
// geometry (size, alignment, slab size, size classes, layout version, page
// size); otherwise it is emptied (truncated, so no old byte is ever read) and
// formatted anew, and the log says why in one line. One service per file: it
// is locked (flock) for as long as it is mapped.

const (
	sbMagic   = "STRATAAR"
	sbBytes   = 256  // one copy's encoding
	sbCopy    = 2048 // the second copy's offset
	umOffset  = 4096 // the unit map's offset
	sbInUse   = 1
	sbClean   = 2
	fileAlign = 2 << 20
)

// opened is what opening the backing found.
type opened struct {
	warm bool   // the file's objects are to be recovered
	why  string // why it starts empty, when not warm
	prev superblock
}

// newSecret is 8 random bytes; crypto/rand never fails on Linux.
func newSecret() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) | 1
}

// openAnonymous maps an anonymous arena: the data from the allocator, the
// unit map beside it.
func openAnonymous(cfg *Config, alloc *hostmem.Allocator, unit, size int64) (*backing, error) {
	slack := int64(0)
	if unit > int64(os.Getpagesize()) {
		slack = unit
	}
	region, err := alloc.Allocate("arena", size+slack)
	if err != nil {
		return nil, fmt.Errorf("arena of %s: %w", hostmem.FormatBytes(size), err)
	}
	mem := region.Bytes()
	skip := (unit - int64(uintptr(unsafe.Pointer(unsafe.SliceData(mem))))%unit) % unit
	g := newGeometry(unit, size, cfg.SlabBytes, int64(os.Getpagesize()), false)
	hdr, err := mapBytes(-1, umOffset+g.umBytes, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE, 0)
	if err != nil {
		_ = region.Close()
		return nil, fmt.Errorf("arena of %s: unit map: %w", hostmem.FormatBytes(size), err)
	}
	b := &backing{fd: -1, mapping: hdr, region: region, data: mem[skip : skip+size : skip+size], geo: g}
	b.umap = unitMap(hdr, g)
	b.sb = superblock{version: layoutVersion, secret: newSecret(), contentID: newSecret(), starts: 1, epoch: 1, unit: unit, size: size}
	return b, nil
}

func unitMap(m []byte, g geometry) []uint32 {
	n := int(g.umBytes / 4)
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(&m[umOffset])), n)
}

// mapBytes maps n bytes of fd (or anonymous memory) at an address that is a
// multiple of align (0: any).
func mapBytes(fd int, n int64, flags int, align int64) ([]byte, error) {
	if align <= int64(os.Getpagesize()) {
		p, err := unix.MmapPtr(fd, 0, nil, uintptr(n), unix.PROT_READ|unix.PROT_WRITE, flags)
		if err != nil {
			return nil, err
		}
		return unsafe.Slice((*byte)(p), n), nil
	}
	// Reserve address space with slack, then map over its aligned part.
	res, err := unix.MmapPtr(-1, 0, nil, uintptr(n+align), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, err
	}
	skip := (align - int64(uintptr(res))%align) % align
	at := unsafe.Add(res, skip)
	p, err := unix.MmapPtr(fd, 0, at, uintptr(n), unix.PROT_READ|unix.PROT_WRITE, flags|unix.MAP_FIXED)
	if err != nil {
		_ = unix.MunmapPtr(res, uintptr(n+align))
		return nil, err
	}
	if skip > 0 {
		_ = unix.MunmapPtr(res, uintptr(skip))
	}
	if tail := align - skip; tail > 0 {
		_ = unix.MunmapPtr(unsafe.Add(at, n), uintptr(tail))
	}
	return unsafe.Slice((*byte)(p), n), nil
}

func unmapBytes(b []byte) {
	if len(b) > 0 {
		_ = unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)))
	}
}

// memoryFS names the file systems an arena file may live on: memory that a
// restarted process maps again, and that is never written back to a disk.
func memoryFS(t int64) (string, bool) {
	switch t {
	case unix.TMPFS_MAGIC:
		return "tmpfs", true
	case unix.HUGETLBFS_MAGIC:
		return "hugetlbfs", true
	case unix.RAMFS_MAGIC:
		return "ramfs", true
	}
	return "", false
}

// openFile opens (owner.go: only a file of the service's own), locks and maps
// the arena file at path, reusing it when its superblock says it holds an
// arena of the same geometry, and formatting it anew otherwise. New writes
// the superblock, where a fault is guarded.
//
// A refusal changes nothing of a file that was there: everything that can
// refuse it (its lock, its file system, the room it needs) is checked before
// a file that cannot be reused is emptied, so that a start refused, say for
// an --arena too large, leaves the warm cache of the service before as it
// was. A file it created, it removes.
func openFile(cfg *Config, unit, size int64) (_ *backing, _ opened, err error) {
	var op opened
	path := cfg.File
	fd, created, err := openOwn(path)
	if err != nil {
		return nil, op, err
	}
	var st unix.Stat_t
	defer func() {
		if err != nil {
			if created {
				removeMade(path, &st)
			}
			_ = unix.Close(fd)
		}
	}()
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, op, fmt.Errorf("arena file %s: %v: %w", path, err, ErrFile)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return nil, op, lockedErr(path, fd, &st)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return nil, op, fmt.Errorf("arena file %s: statfs: %v: %w", path, err, ErrFile)
	}
	fsName, ok := memoryFS(int64(fs.Type))
	if !ok {
		return nil, op, fmt.Errorf("arena file %s is not on tmpfs, hugetlbfs or ramfs (file system type %#x): a file on a disk would be written back as objects change; put it on a tmpfs (e.g. /dev/shm or a tmpfs mounted at the socket's directory): %w",
			path, fs.Type, ErrFile)
	}
	pageSize := int64(os.Getpagesize())
	if fsName == "hugetlbfs" {
		pageSize = fs.Bsize
	}
	g := newGeometry(unit, size, cfg.SlabBytes, pageSize, true)
	var hdr [umOffset]byte
	n, _ := unix.Pread(fd, hdr[:], 0)
	op.prev, op.warm, op.why = pickSuperblock(hdr[:max(n, 0)], st.Size)
	if op.warm {
		switch {
		case g.mismatch(op.prev) != "":
			op.warm, op.why = false, "it cannot be reused: "+g.mismatch(op.prev)
		case st.Size != g.fileSize:
			op.warm, op.why = false, fmt.Sprintf("it is %d bytes, its superblock says %d (truncated or extended)", st.Size, g.fileSize)
		}
	}
	// A file that is not reused is emptied: its pages count as room.
	allocated, freed := st.Blocks*512, int64(0)
	if !op.warm {
		allocated, freed = 0, st.Blocks*512
	}
	short, err := checkRoom(cfg, path, fsName, fs, g.fileSize-allocated, freed)
	if err != nil {
		return nil, op, err
	}
	hdrBytes := roundUp(g.headerBytes(), pageSize)
	if free := int64(fs.Bavail)*fs.Bsize + freed; fsName != "ramfs" && free < hdrBytes-min(allocated, hdrBytes) {
		return nil, op, fmt.Errorf("arena file %s: its header of %s does not fit: the %s has %s free: free room on it or mount it larger: %w",
			path, hostmem.FormatBytes(hdrBytes), fsName, hostmem.FormatBytes(max(free, 0)), errNoRoom)
	}
	if !op.warm {
		// Start empty: nothing of the old file may be read again.
		if err := unix.Ftruncate(fd, 0); err != nil {
			return nil, op, fmt.Errorf("arena file %s: truncate: %v: %w", path, err, ErrFile)
		}
		if err := unix.Ftruncate(fd, g.fileSize); err != nil {
			return nil, op, fmt.Errorf("arena file %s: size it to %d bytes: %v: %w", path, g.fileSize, err, ErrFile)
		}
		if err := unix.Fstatfs(fd, &fs); err != nil {
			return nil, op, fmt.Errorf("arena file %s: statfs: %v: %w", path, err, ErrFile)
		}
	}
	// The header's pages are taken now, so that writing the unit map or the
	// log never meets a full file system (which would be a SIGBUS): 1/1024 of
	// the arena and 8 MiB, allocated at several GB/s. Without room for them
	// the file cannot hold an arena at all (New falls back to anonymous memory).
	if err := unix.Fallocate(fd, 0, 0, hdrBytes); err != nil {
		if !op.warm {
			_ = unix.Ftruncate(fd, 0)
		}
		return nil, op, fmt.Errorf("arena file %s: allocate its header of %s: %v; the %s is full: free room on it or mount it larger: %w",
			path, hostmem.FormatBytes(hdrBytes), err, fsName, errNoRoom)
	}
	if short {
		cfg.Logger.Warn("arena file's file system is short of room: the arena starts with what fits and holds less until there is more",
			"file", path, "fs", fsName, "needBytes", g.fileSize-allocated, "freeBytes", int64(fs.Bavail)*fs.Bsize,
			"fix", "mount it larger (size=, or more vm.nr_hugepages for hugetlbfs), free room on it, or lower --arena; restart to use the room freed")
	}
	m, err := mapBytes(fd, g.fileSize, unix.MAP_SHARED, g.align)
	if err != nil {
		return nil, op, fmt.Errorf("arena file %s: map %s: %v: %w", path, hostmem.FormatBytes(g.fileSize), err, ErrFile)
	}
	if cfg.TransparentHugePages {
		_ = unix.Madvise(m[g.dataOff:], unix.MADV_HUGEPAGE) // advice: tmpfs mounted with huge= honours it
	}
	b := &backing{path: path, fd: fd, mapping: m, data: m[g.dataOff : g.dataOff+size : g.dataOff+size], geo: g}
	if created {
		b.made = &st
	}
	b.umap = unitMap(m, g)
	b.log = m[g.logOff : g.logOff+g.logBytes : g.logOff+g.logBytes]
	now := time.Now().UnixNano()
	if op.warm {
		b.sb = op.prev
		b.sbSlot = int(op.prev.gen % 2)
		b.sb.epoch++
	} else {
		b.sb = superblock{version: layoutVersion, unit: unit, size: size, slabBytes: cfg.SlabBytes, classes: classesFingerprint,
			pageSize: pageSize, dataOff: g.dataOff, fileSize: g.fileSize, secret: newSecret(), contentID: newSecret(),
			starts: op.prev.starts, epoch: 1, gen: op.prev.gen, createdNS: now}
	}
	b.sb.starts++
	b.sb.state, b.sb.pid = sbInUse, uint32(os.Getpid())
	return b, op, nil
}

// begin writes the superblock of a start, in both copies: with one, a single
// damaged byte in it would start the next service empty.
func (b *backing) begin() {
	b.writeSuperblock()
	b.writeSuperblock()
}

// lockedErr says who holds the lock on the arena file: the process /proc/locks
// names, or the pid the superblock recorded.
func lockedErr(path string, fd int, st *unix.Stat_t) error {
	if pid, comm := lockHolder(st); pid > 0 {
		return fmt.Errorf("arena file %s is locked by another process (%s): in use by another node service (pid %d); stop it first, or give this service its own --arena-file: %w",
			path, comm, pid, ErrLocked)
	}
	holder := ""
	var hdr [umOffset]byte
	if n, _ := unix.Pread(fd, hdr[:], 0); n == umOffset {
		if sb, ok, _ := pickSuperblock(hdr[:], umOffset); ok && sb.pid != 0 {
			holder = fmt.Sprintf(" (pid %d)", sb.pid)
		}
	}
	return fmt.Errorf("arena file %s is locked by another process: in use by another node service%s; stop it first, or give this service its own --arena-file: %w", path, holder, ErrLocked)
}

// pickSuperblock chooses the newer valid copy in hdr, the first page of a
// file of size bytes; warm is false, with the reason, when there is none.
func pickSuperblock(hdr []byte, size int64) (sb superblock, warm bool, why string) {
	if size == 0 {
		return sb, false, "it is a new arena file"
	}
	var found, magic bool
	for _, off := range []int{0, sbCopy} {
		if off+sbBytes > len(hdr) {
			continue
		}
		c, ok, m := decodeSuperblock(hdr[off:])
		magic = magic || m
		if ok && (!found || c.gen > sb.gen) {
			sb, found = c, true
		}
	}
	switch {
	case found:
		return sb, true, ""
	case magic:
		return sb, false, "its superblock is damaged"
	}
	return sb, false, "it holds no arena (no superblock)"
}

// checkRoom checks that the file's need bytes more fit, once the freed bytes
// of its old contents are given back (an emptied file's). More than the host's
// memory is refused: tmpfs pages past it get the service OOM-killed. More
// than the file system has free is not (short reports it): a full tmpfs is a
// state of the moment (after a kill, the other users of /dev/shm), so the
// arena starts with what fits and says so once; the warm-up leaves what it
// cannot populate unused (Stats().UnusableBytes) rather than meet a SIGBUS.
// Only an arena handed out without a warm-up (Config.Warmup off: tests,
// benchmarks), whose first writes would meet it, is refused.
func checkRoom(cfg *Config, path, fsName string, fs unix.Statfs_t, need, freed int64) (short bool, err error) {
	if need <= 0 {
		return false, nil
	}
	if free := int64(fs.Bavail)*fs.Bsize + freed; fsName != "ramfs" && need > free {
		if !cfg.Warmup {
			return true, fmt.Errorf("arena file %s needs %s more of its %s, which has %s free: mount it larger (size=, or more vm.nr_hugepages for hugetlbfs) or lower --arena: %w",
				path, hostmem.FormatBytes(need), fsName, hostmem.FormatBytes(max(free, 0)), ErrFile)
		}
		short = true
	}
	avail, reserve := hostmem.AvailableBytes, int64(1<<30)
	if cfg.Allocator != nil {
		ac := cfg.Allocator.Config()
		reserve = ac.ReserveBytes
		if ac.Available != nil {
			avail = ac.Available
		}
	}
	have, err := avail()
	if err != nil {
		return short, nil // without a reading, trust the file system's own limit
	}
	have += freed // tmpfs pages are not available memory until they are freed
	if need > have-reserve {
		return short, fmt.Errorf("arena file %s needs %s more memory, %s available, %s reserved: lower --arena: %w",
			path, hostmem.FormatBytes(need), hostmem.FormatBytes(max(have, 0)), hostmem.FormatBytes(reserve), hostmem.ErrNoMemory)
	}
	return short, nil
}

// removeMade removes the arena file at path if it is still the file st
// describes: one this start created, which a refused start must not leave
// behind. A file that was there before is never removed.
func removeMade(path string, st *unix.Stat_t) {
	var now unix.Stat_t
	if st == nil || unix.Lstat(path, &now) != nil || now.Dev != st.Dev || now.Ino != st.Ino {
		return
	}
	_ = unix.Unlink(path)
}
