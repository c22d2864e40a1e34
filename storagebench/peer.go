package storagebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// DirectIOPeer is the disk doing a file store's job with no store on top: every
// chunk written with O_DIRECT from the caller's memory into its own file and
// fsynced, by Workers writers at once, and read back the same way. With OneFile it
// is the streaming figure instead: the chunks written one after another into one
// file with one fsync per Write, as dd or fio would.
//
// Where the filesystem refuses O_DIRECT (tmpfs returns EINVAL) or a chunk is not
// 4 KiB aligned, the peer falls back to buffered I/O with fsync and evicts what it
// wrote from the page cache before returning, and says so in Notes and Name.
//
// Set the fields before the first Write; a DirectIOPeer must not be copied after.
type DirectIOPeer struct {
	// Dir holds the peer's files. It is created if missing and removed by Close if
	// the peer created it.
	Dir string
	// Workers is the number of chunks in flight: the backend's I/O parallelism.
	// Less than 1 means 1.
	Workers int
	// OneFile writes every chunk into one file, sequentially per worker.
	OneFile bool
	// NoSync skips the fsync, for comparison with a backend that does not sync.
	NoSync bool

	mu         sync.Mutex
	started    bool
	madeDir    bool
	direct     bool // the filesystem accepts O_DIRECT
	unaligned  bool // some chunk could not use O_DIRECT
	chunks     []peerChunk
	next       int // read cursor into chunks
	streamSize int64
	stream     string
}

type peerChunk struct {
	path string
	off  int64
	n    int
}

var _ Peer = (*DirectIOPeer)(nil)

func (p *DirectIOPeer) workers() int { return max(p.Workers, 1) }

// Name describes the peer's I/O.
func (p *DirectIOPeer) Name() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	mode := "o_direct"
	if p.started && (!p.direct || p.unaligned) {
		mode = "buffered"
	}
	if !p.NoSync {
		mode += "+fsync"
	}
	if p.OneFile {
		if p.workers() == 1 {
			return mode + ", 1 stream, one file"
		}
		return fmt.Sprintf("%s, %d streams, one file", mode, p.workers())
	}
	return fmt.Sprintf("%s, %d writers, file per chunk", mode, p.workers())
}

// Notes says how the peer fell back, if it did.
func (p *DirectIOPeer) Notes() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	if p.started && !p.direct {
		out = append(out, "peers: the filesystem refuses O_DIRECT; buffered I/O, files evicted from the page cache (fadvise DONTNEED) after writing")
	} else if p.unaligned {
		out = append(out, "peers: chunks not 4 KiB aligned; buffered I/O for them, evicted from the page cache after writing")
	}
	return out
}

func (p *DirectIOPeer) start() error {
	if p.started {
		return nil
	}
	if p.Dir == "" {
		return fmt.Errorf("peer: no directory: %w", ErrConfig)
	}
	if _, err := os.Stat(p.Dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(p.Dir, 0o755); err != nil {
			return fmt.Errorf("peer: %w", err)
		}
		p.madeDir = true
	}
	ok, err := probeDirectIO(p.Dir)
	if err != nil {
		return fmt.Errorf("peer: %w", err)
	}
	p.direct, p.started = ok, true
	return nil
}

// Write stores src's chunks (see the type's comment).
func (p *DirectIOPeer) Write(ctx context.Context, src [][]byte) (time.Duration, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.start(); err != nil {
		return 0, err
	}
	base := len(p.chunks)
	for i, b := range src {
		c := peerChunk{n: len(b)}
		if p.OneFile {
			if p.stream == "" {
				p.stream = filepath.Join(p.Dir, "stream.dat")
			}
			c.path, c.off = p.stream, p.streamSize
			p.streamSize += int64(len(b))
		} else {
			c.path = filepath.Join(p.Dir, fmt.Sprintf("chunk-%08d", base+i))
		}
		p.chunks = append(p.chunks, c)
	}
	chunks := p.chunks[base:]
	for _, b := range src {
		if !aligned(b) {
			p.unaligned = true
		}
	}
	if p.OneFile {
		return p.writeOneFile(ctx, src, chunks)
	}
	start := time.Now()
	err := parallel(ctx, p.workers(), len(src), func(i int) error {
		return p.writeChunkFile(chunks[i].path, src[i])
	})
	return time.Since(start), err
}

// openFlags adds O_DIRECT when the filesystem and b allow it.
func (p *DirectIOPeer) openFlags(flags int, b []byte) int {
	if p.direct && aligned(b) {
		flags |= syscall.O_DIRECT
	}
	return flags
}

func (p *DirectIOPeer) writeChunkFile(path string, b []byte) (err error) {
	f, err := os.OpenFile(path, p.openFlags(os.O_WRONLY|os.O_CREATE|os.O_TRUNC, b), 0o644)
	if err != nil {
		return fmt.Errorf("peer write: %w", err)
	}
	defer func() {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("peer write: %w", cerr)
		}
	}()
	if _, err := f.Write(b); err != nil {
		return fmt.Errorf("peer write: %w", err)
	}
	return p.finish(f, path, b)
}

// finish syncs a written file and, when the write went through the page cache,
// evicts it so that reads come from the device.
func (p *DirectIOPeer) finish(f *os.File, path string, b []byte) error {
	if !p.NoSync {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("peer fsync %s: %w", path, err)
		}
	}
	if p.openFlags(0, b) == 0 {
		if err := dropFileCache(path); err != nil {
			return fmt.Errorf("peer: %w", err)
		}
	}
	return nil
}

func (p *DirectIOPeer) writeOneFile(ctx context.Context, src [][]byte, chunks []peerChunk) (time.Duration, error) {
	direct := true
	for _, b := range src {
		direct = direct && p.direct && aligned(b)
	}
	flags := os.O_WRONLY | os.O_CREATE
	if direct {
		flags |= syscall.O_DIRECT
	}
	start := time.Now()
	f, err := os.OpenFile(p.stream, flags, 0o644)
	if err != nil {
		return 0, fmt.Errorf("peer write: %w", err)
	}
	err = parallel(ctx, p.workers(), len(src), func(i int) error {
		if _, err := f.WriteAt(src[i], chunks[i].off); err != nil {
			return fmt.Errorf("peer write: %w", err)
		}
		return nil
	})
	if err == nil && !p.NoSync {
		if err = f.Sync(); err != nil {
			err = fmt.Errorf("peer fsync %s: %w", p.stream, err)
		}
	}
	elapsed := time.Since(start)
	if cerr := f.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("peer write: %w", cerr)
	}
	if err == nil && !direct {
		err = dropFileCache(p.stream)
	}
	return elapsed, err
}

// Read reads chunks back (see the Peer interface).
func (p *DirectIOPeer) Read(ctx context.Context, dst [][]byte) (time.Duration, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.next+len(dst) > len(p.chunks) {
		return 0, fmt.Errorf("peer read: %d chunks asked, %d written and not read yet", len(dst), len(p.chunks)-p.next)
	}
	chunks := p.chunks[p.next : p.next+len(dst)]
	for i, c := range chunks {
		if len(dst[i]) != c.n {
			return 0, fmt.Errorf("peer read: chunk %d is %d bytes, buffer %d", p.next+i, c.n, len(dst[i]))
		}
	}
	p.next += len(dst)
	if p.OneFile {
		return p.readOneFile(ctx, dst, chunks)
	}
	start := time.Now()
	err := parallel(ctx, p.workers(), len(dst), func(i int) error {
		f, err := os.OpenFile(chunks[i].path, p.openFlags(os.O_RDONLY, dst[i]), 0)
		if err != nil {
			return fmt.Errorf("peer read: %w", err)
		}
		defer f.Close()
		if _, err := io.ReadFull(f, dst[i]); err != nil {
			return fmt.Errorf("peer read %s: %w", chunks[i].path, err)
		}
		return nil
	})
	elapsed := time.Since(start)
	if err == nil {
		// What was read is not needed again: free the disk space as the run goes.
		for _, c := range chunks {
			_ = os.Remove(c.path)
		}
	}
	return elapsed, err
}

func (p *DirectIOPeer) readOneFile(ctx context.Context, dst [][]byte, chunks []peerChunk) (time.Duration, error) {
	direct := true
	for _, b := range dst {
		direct = direct && p.direct && aligned(b)
	}
	flags := os.O_RDONLY
	if direct {
		flags |= syscall.O_DIRECT
	}
	start := time.Now()
	f, err := os.OpenFile(p.stream, flags, 0)
	if err != nil {
		return 0, fmt.Errorf("peer read: %w", err)
	}
	defer f.Close()
	err = parallel(ctx, p.workers(), len(dst), func(i int) error {
		if _, err := f.ReadAt(dst[i], chunks[i].off); err != nil {
			return fmt.Errorf("peer read %s at %d: %w", p.stream, chunks[i].off, err)
		}
		return nil
	})
	return time.Since(start), err
}

// Close removes the peer's files, and its directory if it made it.
func (p *DirectIOPeer) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, c := range p.chunks[p.next:] {
		if err := os.Remove(c.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if p.stream != "" {
		if err := os.Remove(p.stream); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	p.chunks, p.next, p.stream, p.streamSize = nil, 0, "", 0
	if p.madeDir {
		if err := os.Remove(p.Dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		p.madeDir = false
	}
	return errors.Join(errs...)
}

// parallel runs fn(0..n-1) on up to workers goroutines and returns the first
// error; after an error or cancellation no new index starts.
func parallel(ctx context.Context, workers, n int, fn func(i int) error) error {
	workers = min(workers, n)
	if workers <= 1 {
		for i := 0; i < n; i++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := fn(i); err != nil {
				return err
			}
		}
		return nil
	}
	var (
		next     atomic.Int64
		failed   atomic.Bool
		once     sync.Once
		firstErr error
		wg       sync.WaitGroup
	)
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				err := ctx.Err()
				if err == nil {
					err = fn(i)
				}
				if err != nil {
					once.Do(func() { firstErr = err })
					failed.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	return firstErr
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
