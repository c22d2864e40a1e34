package storagebench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/stratakv/strata/hostmem"
)

// MemcpyPeer is the physical limit of a service that copies: every chunk copied
// with copy() from the caller's memory into a second host region (mapped and
// prefaulted as the node service's arena is), by Workers goroutines taking chunks
// in turn as the service's copy workers do, and copied back out on Read. No
// socket, no lookup, no allocation inside the timed part.
//
// Set the fields before the first Write; a MemcpyPeer must not be copied after.
type MemcpyPeer struct {
	// Workers is the number of goroutines that copy: the service's CopyWorkers.
	// Less than 1 means 1.
	Workers int
	// Capacity is the bytes the peer can hold: every chunk the run writes. The
	// region is mapped at the first Write, outside the timed part.
	Capacity int64
	// Available reports the host memory the region may take; nil means
	// hostmem.AvailableBytes.
	Available func() (int64, error)

	mu     sync.Mutex
	region *hostmem.Region
	used   int64
	chunks []memChunk
	next   int // read cursor into chunks
}

type memChunk struct{ off, n int64 }

var _ Peer = (*MemcpyPeer)(nil)

// memcpyAlign places chunks as the arena does (4 KiB aligned); chunks smaller
// than that are packed at cache-line boundaries instead, so that a run of small
// objects does not need a region of 4 KiB per object.
const (
	memcpyAlign      = 4096
	memcpySmallAlign = 64
)

func (p *MemcpyPeer) workers() int { return max(p.Workers, 1) }

// Name describes the peer.
func (p *MemcpyPeer) Name() string {
	g := "goroutines"
	if p.workers() == 1 {
		g = "goroutine"
	}
	return fmt.Sprintf("memcpy, %d %s, copy() between two host regions", p.workers(), g)
}

func (p *MemcpyPeer) start() error {
	if p.region != nil {
		return nil
	}
	if p.Capacity <= 0 {
		return fmt.Errorf("memcpy peer: capacity %d: want positive: %w", p.Capacity, ErrConfig)
	}
	cfg := hostmem.DefaultConfig(hostmem.Mmap)
	cfg.Available = p.Available
	alloc, err := hostmem.New(cfg)
	if err != nil {
		return fmt.Errorf("memcpy peer: %w", err)
	}
	if p.region, err = alloc.Allocate("storagebench-memcpy-peer", p.Capacity); err != nil {
		return fmt.Errorf("memcpy peer: %w; lower --batches", err)
	}
	return nil
}

// Write copies src's chunks into the peer's region (see the type's comment).
func (p *MemcpyPeer) Write(ctx context.Context, src [][]byte) (time.Duration, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.start(); err != nil {
		return 0, err
	}
	chunks := make([]memChunk, len(src))
	used := p.used
	for i, b := range src {
		n := int64(len(b))
		align := int64(memcpyAlign)
		if n < memcpyAlign {
			align = memcpySmallAlign
		}
		off := (used + align - 1) / align * align
		if off+n > p.region.Size() {
			return 0, fmt.Errorf("memcpy peer: %d bytes more do not fit in its %d-byte region: %w", n, p.region.Size(), ErrConfig)
		}
		chunks[i] = memChunk{off: off, n: n}
		used = off + n
	}
	p.chunks, p.used = append(p.chunks, chunks...), used
	mem := p.region.Bytes()
	start := time.Now()
	err := parallel(ctx, p.workers(), len(src), func(i int) error {
		c := chunks[i]
		copy(mem[c.off:c.off+c.n], src[i])
		return nil
	})
	return time.Since(start), err
}

// Read copies the next len(dst) chunks back out (see the Peer interface).
func (p *MemcpyPeer) Read(ctx context.Context, dst [][]byte) (time.Duration, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.next+len(dst) > len(p.chunks) {
		return 0, fmt.Errorf("memcpy peer read: %d chunks asked, %d written and not read yet", len(dst), len(p.chunks)-p.next)
	}
	chunks := p.chunks[p.next : p.next+len(dst)]
	for i, c := range chunks {
		if int64(len(dst[i])) != c.n {
			return 0, fmt.Errorf("memcpy peer read: chunk %d is %d bytes, buffer %d", p.next+i, c.n, len(dst[i]))
		}
	}
	p.next += len(dst)
	mem := p.region.Bytes()
	start := time.Now()
	err := parallel(ctx, p.workers(), len(dst), func(i int) error {
		c := chunks[i]
		copy(dst[i], mem[c.off:c.off+c.n])
		return nil
	})
	return time.Since(start), err
}

// Close unmaps the peer's region. It may be called more than once.
func (p *MemcpyPeer) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var err error
	if p.region != nil {
		if cerr := p.region.Close(); cerr != nil {
			err = fmt.Errorf("memcpy peer: %w", cerr)
		}
	}
	p.region, p.used, p.chunks, p.next = nil, 0, nil, 0
	return err
}
