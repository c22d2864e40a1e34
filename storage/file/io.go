package file

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"unsafe"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/internal/vecio"
	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/storage"
)

const (
	// blockSize is the alignment of O_DIRECT offsets, lengths and buffers. Devices
	// with 512-byte logical blocks accept it too.
	blockSize = 4096
	// bounceBytes is the aligned buffer that carries the unaligned edges of a body
	// under O_DIRECT, per I/O worker. Bodies in unaligned host memory move through
	// it in chunks of this size.
	bounceBytes = 256 << 10
	// maxIovecs is Linux's IOV_MAX: the most runs one preadv/pwritev takes.
	maxIovecs = 1024
)

func roundUp(n, to int64) int64   { return (n + to - 1) / to * to }
func roundDown(n, to int64) int64 { return n / to * to }

// body is the bytes of one object part in host memory: runs of the pool's region,
// concatenated in layout order.
type body struct {
	runs   [][]byte
	starts []int64 // body offset of each run
	n      int64
}

// setSpan points b at the runs of span s in mem, reusing b's slices.
func (b *body) setSpan(mem []byte, s kvlayout.Span) {
	b.runs, b.starts, b.n = b.runs[:0], b.starts[:0], 0
	if s.Contiguous() {
		b.add(mem[s.Offset : s.Offset+s.Bytes() : s.Offset+s.Bytes()])
		return
	}
	for r := 0; r < s.Count; r++ {
		off := s.Offset + int64(r)*s.Stride
		b.add(mem[off : off+s.RunBytes : off+s.RunBytes])
	}
}

func (b *body) add(run []byte) {
	b.runs = append(b.runs, run)
	b.starts = append(b.starts, b.n)
	b.n += int64(len(run))
}

// sum is the xxh3-64 of the body's bytes.
func (b *body) sum() uint64 {
	if len(b.runs) == 1 {
		return xxh3.Hash(b.runs[0])
	}
	h := xxh3.New()
	for _, r := range b.runs {
		_, _ = h.Write(r)
	}
	return h.Sum64()
}

// run returns the index of the run that holds body offset off.
func (b *body) run(off int64) int {
	return sort.Search(len(b.starts), func(i int) bool { return b.starts[i] > off }) - 1
}

// copyOut fills dst with the body's bytes from offset off, zero past the end.
func (b *body) copyOut(dst []byte, off int64) {
	for len(dst) > 0 && off < b.n {
		r := b.run(off)
		n := copy(dst, b.runs[r][off-b.starts[r]:])
		dst, off = dst[n:], off+int64(n)
	}
	clear(dst)
}

// copyIn stores src as the body's bytes from offset off, dropping what lies past the end.
func (b *body) copyIn(src []byte, off int64) {
	for len(src) > 0 && off < b.n {
		r := b.run(off)
		n := copy(b.runs[r][off-b.starts[r]:], src)
		src, off = src[n:], off+int64(n)
	}
}

// segment is a block-aligned range of a body under O_DIRECT: either host memory
// that the device can reach directly (mem) or a range that goes through the
// bounce buffer (mem nil).
type segment struct {
	off, n int64
	mem    []byte
}

// planDirect splits the body, padded to whole blocks, into segments: the blocks
// that lie inside one run at an address with the same alignment as their file
// offset move straight between the device and host memory; the rest (run edges,
// small or misaligned runs, the final partial block) use the bounce buffer.
func planDirect(b *body, dst []segment) []segment {
	dst = dst[:0]
	var at int64 // end of the last segment
	for i, run := range b.runs {
		if len(run) == 0 {
			continue
		}
		start, end := b.starts[i], b.starts[i]+int64(len(run))
		addr := int64(uintptr(unsafe.Pointer(unsafe.SliceData(run))) % blockSize)
		// File offset headerSize+start is aligned exactly when start is.
		if addr != start%blockSize {
			continue
		}
		lo, hi := roundUp(start, blockSize), roundDown(end, blockSize)
		if hi <= lo {
			continue
		}
		if lo > at {
			dst = append(dst, segment{off: at, n: lo - at})
		}
		dst = append(dst, segment{off: lo, n: hi - lo, mem: run[lo-start : hi-start : hi-start]})
		at = hi
	}
	if padded := roundUp(b.n, blockSize); at < padded {
		dst = append(dst, segment{off: at, n: padded - at})
	}
	return dst
}

// ioBuf is one I/O worker's scratch: an aligned header block, an aligned bounce
// buffer (allocated on first direct I/O) and reusable slices.
type ioBuf struct {
	hdr    []byte
	bounce []byte
	body   body
	segs   []segment
	iovs   [][]byte
	pend   []pending
}

// pending is a bounce chunk read from disk, to copy into the body after the read.
type pending struct {
	chunk []byte
	off   int64
}

func newIOBuf() *ioBuf { return &ioBuf{hdr: vecio.AlignedBytes(headerSize, blockSize)} }

func (b *ioBuf) bounceBuf() []byte {
	if b.bounce == nil {
		b.bounce = vecio.AlignedBytes(bounceBytes, blockSize)
	}
	return b.bounce
}

// writeFile writes the header block b.hdr and the body to fd from offset 0. Under
// direct the file is padded to whole blocks and truncated to its length after.
func writeFile(fd int, b *ioBuf, direct bool) error {
	if !direct {
		return pwritevAll(fd, b.bufferedIovs(), 0)
	}
	bd := &b.body
	fileOff, err := b.directIO(bd.copyOut, func(iovs [][]byte, fileOff, _ int64) error {
		return pwritevAll(fd, iovs, fileOff)
	})
	if err != nil {
		return err
	}
	if want := headerSize + bd.n; fileOff != want {
		return retryEINTR(func() error { return unix.Ftruncate(fd, want) })
	}
	return nil
}

// readFile reads the header block into b.hdr and a body of size-headerSize bytes
// into b.body from fd, whose length is size. It reports io.ErrUnexpectedEOF when
// the file turns out shorter.
func readFile(fd int, b *ioBuf, size int64, direct bool) error {
	if !direct {
		return preadvFull(fd, b.bufferedIovs(), 0, size)
	}
	bd := &b.body
	pend := b.pend[:0]
	_, err := b.directIO(func(chunk []byte, off int64) {
		pend = append(pend, pending{chunk: chunk, off: off})
	}, func(iovs [][]byte, fileOff, n int64) error {
		if err := preadvFull(fd, iovs, fileOff, min(n, size-fileOff)); err != nil {
			return err
		}
		for _, p := range pend {
			bd.copyIn(p.chunk, p.off)
		}
		pend = pend[:0]
		return nil
	})
	b.pend = pend
	return err
}

// bufferedIovs is the header block followed by the body's runs: a buffered
// read or write of a whole file in one vector.
func (b *ioBuf) bufferedIovs() [][]byte {
	iovs := append(b.iovs[:0], b.hdr)
	iovs = append(iovs, b.body.runs...)
	b.iovs = iovs
	return iovs
}

// directIO is the O_DIRECT plan that writeFile and readFile share, so that both
// cut a body into the same batches: the header block, then the body padded to
// whole blocks as planDirect's segments, host memory the device can reach in
// place and the rest through the bounce buffer, in batches of at most maxIovecs
// runs and one bounce buffer's worth of chunks. stage is called on each bounce
// chunk as it is queued, with its body offset (a write fills it from the body);
// move does one batch's I/O, n bytes at file offset fileOff, and is done with the
// batch's bounce chunks when it returns (a read copies them into the body). The
// result is the file offset after the last batch.
func (b *ioBuf) directIO(stage func(chunk []byte, off int64), move func(iovs [][]byte, fileOff, n int64) error) (int64, error) {
	b.segs = planDirect(&b.body, b.segs)
	bounce := b.bounceBuf()
	iovs := append(b.iovs[:0], b.hdr)
	fileOff, queued, used := int64(0), int64(headerSize), 0
	flush := func() error {
		if err := move(iovs, fileOff, queued); err != nil {
			return err
		}
		fileOff += queued
		iovs, queued, used = iovs[:0], 0, 0
		return nil
	}
	for _, s := range b.segs {
		if s.mem != nil {
			iovs = append(iovs, s.mem)
			queued += s.n
		} else {
			for off, end := s.off, s.off+s.n; off < end; {
				if used == len(bounce) {
					if err := flush(); err != nil {
						return fileOff, err
					}
				}
				k := min(end-off, int64(len(bounce)-used))
				chunk := bounce[used : used+int(k)]
				stage(chunk, off)
				iovs = append(iovs, chunk)
				queued += k
				used += int(k)
				off += k
				if len(iovs) == maxIovecs {
					if err := flush(); err != nil {
						return fileOff, err
					}
				}
			}
		}
		if len(iovs) == maxIovecs {
			if err := flush(); err != nil {
				return fileOff, err
			}
		}
	}
	var err error
	if len(iovs) > 0 {
		err = flush()
	}
	b.iovs = iovs
	return fileOff, err
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

// pwritevAll writes every byte of iovs at off, in calls of at most maxIovecs runs,
// resuming after short writes.
func pwritevAll(fd int, iovs [][]byte, off int64) error {
	for len(iovs) > 0 {
		batch := iovs[:min(len(iovs), maxIovecs)]
		n, err := vecio.Pwritev(fd, batch, off)
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		off += int64(n)
		iovs = vecio.Advance(iovs, n)
	}
	return nil
}

// preadvFull reads want bytes into the front of iovs from off (the file may end
// inside the last run, as an O_DIRECT read of a padded final block does).
func preadvFull(fd int, iovs [][]byte, off, want int64) error {
	for want > 0 {
		batch := iovs[:min(len(iovs), maxIovecs)]
		n, err := vecio.Preadv(fd, batch, off)
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		off += int64(n)
		want -= int64(n)
		iovs = vecio.Advance(iovs, n)
	}
	return nil
}

func retryEINTR(f func() error) error {
	for {
		if err := f(); err != unix.EINTR {
			return err
		}
	}
}

// ioError classifies a failed syscall on path for the caller: device or quota full
// is storage.ErrNoSpace, anything else storage.ErrIO. The errno stays in the chain.
func ioError(op, path string, err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("file store: %s %s: %w; free space on the device or lower CapacityBytes below its free space: %w",
			op, path, err, storage.ErrNoSpace)
	}
	return fmt.Errorf("file store: %s %s: %w: %w", op, path, err, storage.ErrIO)
}
