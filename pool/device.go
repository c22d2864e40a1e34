package pool

import (
	"errors"
	"fmt"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/kvlayout"
)

// PageMove pairs one device page with one host page for a copy.
type PageMove struct {
	Device PageID
	Host   PageID
}

// DevicePool is one model's KV in accelerator memory (L1) as strata sees it. The
// engine implements it over its own memory (a CUDA implementation issues one
// strided copy per move and returns when they completed); MemDevicePool is a
// host-memory stand-in for tests and the simulator. The copy engine calls the
// methods from several goroutines at once, always with disjoint device pages.
type DevicePool interface {
	// Name matches the host pool this device pool exchanges pages with.
	Name() string
	// Layout is the device pool's geometry and byte order.
	Layout() kvlayout.Layout
	// LoadLayer copies one layer of each move's host page into its device page (L2→L1).
	LoadLayer(layer int, host *HostPool, moves []PageMove) error
	// BackupLayer copies one layer of each move's device page into its host page (L1→L2).
	BackupLayer(layer int, host *HostPool, moves []PageMove) error
}

// LayerGroupPool is a DevicePool that also copies several adjacent layers of each
// page in one call, in the order that reads or writes a page-first side front to
// back. The copy engine uses it for jobs of CopyConfig.LayersPerJob layers. Why it
// matters: one layer of a page-first page is a short run per token (2 KiB for
// Llama-3) at a stride of every layer (64 KiB), so per-layer copies read memory in
// short strided bursts that hardware prefetchers restart on every run, and a load is
// bound by read latency instead of bandwidth. A group of layers reads the page's
// token entries for all of them as one contiguous run per token and writes each
// layer-first layer as its own sequential stream.
type LayerGroupPool interface {
	DevicePool
	// GroupsLayers reports whether the engine may copy self, the DevicePool it
	// holds, through LoadLayers and BackupLayers. A type that embeds a
	// LayerGroupPool to wrap its per-layer copies (gate, count or fail them) gets
	// the embedded group methods too, which would bypass its overrides: an
	// implementation answers true only when self is itself.
	GroupsLayers(self DevicePool) bool
	// LoadLayers copies layers first through first+count-1 of each move's host page
	// into its device page (L2→L1).
	LoadLayers(first, count int, host *HostPool, moves []PageMove) error
	// BackupLayers copies layers first through first+count-1 of each move's device
	// page into its host page (L1→L2).
	BackupLayers(first, count int, host *HostPool, moves []PageMove) error
}

// PageSpace allocates the pages of a device group. Engines plug in their own
// allocator; *PageAllocator implements it.
type PageSpace interface {
	Alloc(n int) ([]PageID, error)
	Free(pages []PageID) error
	FreePages() int
	Pages() int
}

var _ PageSpace = (*PageAllocator)(nil)

// DeviceGroup is the L1 side of a pool group: one DevicePool per host pool, in the
// same order, sharing one page space.
type DeviceGroup struct {
	Pools []DevicePool
	Pages PageSpace
}

// Validate reports whether d can exchange pages with host: the same pools in the
// same order with the same geometries and page size.
func (d DeviceGroup) Validate(host *Group) error {
	if d.Pages == nil {
		return fmt.Errorf("device group has no page space: %w", ErrConfig)
	}
	if len(d.Pools) != len(host.pools) {
		return fmt.Errorf("device group has %d pools, host group %d: %w", len(d.Pools), len(host.pools), ErrMismatch)
	}
	for i, dp := range d.Pools {
		if err := checkPair(dp, host.pools[i]); err != nil {
			return err
		}
		if dp.Layout().Pages != d.Pages.Pages() {
			return fmt.Errorf("device pool %q has %d pages, its page space %d: %w", dp.Name(), dp.Layout().Pages, d.Pages.Pages(), ErrMismatch)
		}
	}
	return nil
}

func checkPair(dp DevicePool, hp *HostPool) error {
	if dp.Name() != hp.name {
		return fmt.Errorf("device pool %q paired with host pool %q: %w", dp.Name(), hp.name, ErrMismatch)
	}
	if !dp.Layout().Compatible(hp.layout) {
		return fmt.Errorf("pool %q: device %v, host %v: geometry and page size must match: %w", hp.name, dp.Layout(), hp.layout, ErrMismatch)
	}
	return nil
}

// MemDevicePool is a DevicePool in host memory: the stand-in for an accelerator
// that tests and the simulator use. Its bytes are readable so a test can check
// exactly what a load wrote.
type MemDevicePool struct {
	name   string
	layout kvlayout.Layout
	region *hostmem.Region
}

var _ LayerGroupPool = (*MemDevicePool)(nil)

// NewMemDevicePool allocates a stand-in device pool from alloc.
func NewMemDevicePool(name string, layout kvlayout.Layout, alloc *hostmem.Allocator) (*MemDevicePool, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	if err := layout.Validate(); err != nil {
		return nil, fmt.Errorf("device pool %q: %w", name, err)
	}
	region, err := alloc.Allocate("device-"+name, layout.PoolBytes())
	if err != nil {
		return nil, fmt.Errorf("device pool %q: %w", name, err)
	}
	return &MemDevicePool{name: name, layout: layout, region: region}, nil
}

// NewMemDeviceGroup builds one stand-in device pool per pool of spec (with spec's
// layout and page count) and a page allocator for them.
func NewMemDeviceGroup(spec GroupSpec, alloc *hostmem.Allocator) (DeviceGroup, func() error, error) {
	if err := spec.Validate(); err != nil {
		return DeviceGroup{}, nil, err
	}
	pages, err := NewPageAllocator(spec.Pages)
	if err != nil {
		return DeviceGroup{}, nil, err
	}
	var pools []*MemDevicePool
	closeAll := func() error {
		var errs []error
		for _, p := range pools {
			errs = append(errs, p.Close())
		}
		return errors.Join(errs...)
	}
	g := DeviceGroup{Pages: pages}
	for _, ps := range spec.Pools {
		layout, _ := kvlayout.New(ps.Geometry, spec.Layout, spec.PageSize, spec.Pages)
		p, err := NewMemDevicePool(ps.Name, layout, alloc)
		if err != nil {
			return DeviceGroup{}, nil, errors.Join(err, closeAll())
		}
		pools = append(pools, p)
		g.Pools = append(g.Pools, p)
	}
	return g, closeAll, nil
}

// Name is the pool's name.
func (d *MemDevicePool) Name() string { return d.name }

// Layout is the pool's geometry and byte order.
func (d *MemDevicePool) Layout() kvlayout.Layout { return d.layout }

// Bytes is the pool's memory.
func (d *MemDevicePool) Bytes() []byte { return d.region.Bytes()[:d.layout.PoolBytes()] }

// Close releases the pool's memory.
func (d *MemDevicePool) Close() error { return d.region.Close() }

// LoadLayer copies layer of each move's host page into its device page.
func (d *MemDevicePool) LoadLayer(layer int, host *HostPool, moves []PageMove) error {
	return d.copyLayers(layer, 1, host, moves, true)
}

// BackupLayer copies layer of each move's device page into its host page.
func (d *MemDevicePool) BackupLayer(layer int, host *HostPool, moves []PageMove) error {
	return d.copyLayers(layer, 1, host, moves, false)
}

// GroupsLayers is true when self is d, not a type that embeds it.
func (d *MemDevicePool) GroupsLayers(self DevicePool) bool {
	p, ok := self.(*MemDevicePool)
	return ok && p == d
}

// LoadLayers copies layers first through first+count-1 of each move's host page
// into its device page.
func (d *MemDevicePool) LoadLayers(first, count int, host *HostPool, moves []PageMove) error {
	return d.copyLayers(first, count, host, moves, true)
}

// BackupLayers copies layers first through first+count-1 of each move's device page
// into its host page.
func (d *MemDevicePool) BackupLayers(first, count int, host *HostPool, moves []PageMove) error {
	return d.copyLayers(first, count, host, moves, false)
}

func (d *MemDevicePool) copyLayers(first, count int, host *HostPool, moves []PageMove, load bool) error {
	if err := checkPair(d, host); err != nil {
		return err
	}
	if L := d.layout.Geometry.Layers; count < 1 || first < 0 || first+count > L {
		return fmt.Errorf("pool %q: layers %d to %d of %d: %w", d.name, first, first+count-1, L, ErrConfig)
	}
	if err := checkMoves(moves, d.layout.Pages, host.layout.Pages); err != nil {
		return fmt.Errorf("pool %q: %w", d.name, err)
	}
	dev, hb := d.Bytes(), host.Bytes()
	dl, hl := d.layout, host.layout
	if load {
		copyPageLayers(dev, dl, hb, hl, first, count, moves, true, !raceEnabled)
	} else {
		copyPageLayers(hb, hl, dev, dl, first, count, moves, false, !raceEnabled)
	}
	return nil
}

// prefetchAhead is how far ahead of the copy copyPageLayers names its reads of short
// runs at a row's stride: a few memory latencies' worth of copying for one core
// (100 ns at 10-20 GB/s is 1-2 KiB), with room for a busy memory system.
const prefetchAhead = 8 << 10

// maxPrefetchRun is the shortest run of one token's layers, read from a page_first
// page, that copyPageLayers copies as part of one sequential stream instead of
// prefetching the next run by name.
const maxPrefetchRun = 32 << 10

// seqPrefetch is how far ahead of its loads copyRuns prefetches a source it reads
// as one stream: a few hundred bytes, as the runtime's large memmove does (448 and
// 640).
const seqPrefetch int64 = 512

// copyPageLayers copies layers first..first+count-1 of buffer pages between two
// pools: from src page m.Host to dst page m.Device when toDevice, else from src
// page m.Device to dst page m.Host. stream selects the streaming-store kernels;
// race-detector builds pass false, because the detector does not see the stores
// of assembly code, and get plain copies.
//
// When both sides or neither are page_first, both hold each layer of a page
// contiguously, and it copies layer by layer. When exactly one side is page_first,
// every access is kept sequential, which is what hardware prefetchers and
// write-combining streaming stores need on any CPU:
//   - count > 1: token by token, the page_first side is read (or written) front to
//     back, the token's count layer entries as one contiguous run, and the other
//     side is count sequential streams, one per layer. Reading a layer_first side,
//     the count read streams are what a CPU's stream prefetchers follow at once,
//     so backups use small groups (CopyConfig.LayersPerJob; on a 2-core AMD EPYC
//     4 layers 0.90x of memcpy, 8 0.77x, 32 0.50x). Writing a layer_first side,
//     each stream gets whole runs (2 KiB for Llama-3) of streaming stores, full
//     cache lines that need no read-for-ownership and leave no write-combining
//     buffer half full, so the number of streams does not matter.
//   - A long run (maxPrefetchRun and more, such as the 31 layers after a load's
//     lead layer) is read as one stream that also covers the few layers of the row
//     that another job copies (at most a quarter of the run): those are loaded and
//     dropped (touch). Skipping 2 KiB of every 64 KiB row breaks the stream, and a
//     CPU's prefetchers then start over at every row (on a 2-core AMD EPYC the
//     31-layer tail ran at 0.65-0.78x of memcpy skipping layer 0, 0.90-0.96x
//     reading it, for 1/32 more reads).
//   - count == 1, or a short run: a page_first source jumps a whole row (64 KiB)
//     per token, which no hardware prefetcher follows, so the copy prefetches the
//     same layer a few tokens ahead by name (prefetchAhead). One layer of a page
//     is one call for all its tokens: a call from Go per 2 KiB run costs about as
//     much as the copy (a lead layer went from 0.30x to 0.47x of memcpy's speed
//     per byte with one call per page).
//
// copyRuns does the copying: 32-byte loads, streaming stores and source
// prefetching (the loop of the runtime's memmove for large moves), many runs per
// call.
func copyPageLayers(dst []byte, dl kvlayout.Layout, src []byte, sl kvlayout.Layout, first, count int, moves []PageMove, toDevice, stream bool) {
	g := dl.Geometry
	entry := int64(g.TokenLayerBytes())
	ps := dl.PageSize
	pages := func(m PageMove) (int, int) {
		if toDevice {
			return int(m.Device), int(m.Host)
		}
		return int(m.Host), int(m.Device)
	}
	if (dl.Kind == kvlayout.PageFirst) == (sl.Kind == kvlayout.PageFirst) {
		for _, m := range moves {
			dp, sp := pages(m)
			for buf := 0; buf < g.Buffers(); buf++ {
				for layer := first; layer < first+count; layer++ {
					CopySpan(dst, dl.PageLayerSpan(buf, layer, dp), src, sl.PageLayerSpan(buf, layer, sp), entry)
				}
			}
		}
		return
	}
	run := int64(count) * entry
	srcRows := sl.Kind == kvlayout.PageFirst
	// Long runs of a page_first source: the layers of the row outside the run that
	// are read anyway to keep the stream whole.
	long := srcRows && run >= maxPrefetchRun
	lead := long && int64(first)*entry*4 <= run
	trail := long && int64(g.Layers-first-count)*entry*4 <= run
	// Short runs of a page_first source are prefetched by name: each copy
	// prefetches the source of the same layer ahead tokens later, at least
	// prefetchAhead bytes of this job's reads ahead, so that the jump to the next
	// token's run does not wait a memory latency for a hardware prefetcher to
	// notice it. Other sources are read as streams (one per layer).
	ahead := int64(max(1, (prefetchAhead+count*int(entry)-1)/(count*int(entry))))
	for _, m := range moves {
		dp, sp := pages(m)
		for buf := 0; buf < g.Buffers(); buf++ {
			d0, s0 := dl.Offset(buf, first, dp*ps), sl.Offset(buf, first, sp*ps)
			// Offset of layer first+i, token t is base + i*lstep + t*tstep on either
			// side: the page_first side steps by one entry per layer and a row per
			// token, the other by a whole layer and one entry.
			dlstep, slstep := dl.Offset(buf, first+1, dp*ps)-d0, sl.Offset(buf, first+1, sp*ps)-s0
			dtstep, ststep := dl.Offset(buf, first, dp*ps+1)-d0, sl.Offset(buf, first, sp*ps+1)-s0
			if !stream {
				for tok := int64(0); tok < int64(ps); tok++ {
					for i := int64(0); i < int64(count); i++ {
						d, s := d0+i*dlstep+tok*dtstep, s0+i*slstep+tok*ststep
						copy(dst[d:d+entry], src[s:s+entry])
					}
				}
				continue
			}
			pf := seqPrefetch
			if srcRows && !long {
				pf = ahead * ststep
			}
			if count == 1 {
				// One layer of a page: one call for all its tokens.
				copyRuns(dst, d0, dtstep, src, s0, ststep, entry, ps, pf)
				continue
			}
			for tok := int64(0); tok < int64(ps); tok++ {
				ds, ss := d0+tok*dtstep, s0+tok*ststep
				if lead {
					row := ss - int64(first)*entry
					touch(src[row:ss])
				}
				copyRuns(dst, ds, dlstep, src, ss, slstep, entry, count, pf)
				if trail {
					touch(src[ss+run : ss-int64(first)*entry+int64(g.Layers)*entry])
				}
			}
		}
	}
	if stream {
		finishRuns()
	}
}

func checkMoves(moves []PageMove, devicePages, hostPages int) error {
	for _, m := range moves {
		if m.Device < 0 || int(m.Device) >= devicePages {
			return fmt.Errorf("device page %d of %d: %w", m.Device, devicePages, ErrForeignPage)
		}
		if m.Host < 0 || int(m.Host) >= hostPages {
			return fmt.Errorf("host page %d of %d: %w", m.Host, hostPages, ErrForeignPage)
		}
	}
	return nil
}

// CopySpan copies the entries of src span ss into dst span ds, in order. Both spans
// must hold the same number of bytes, made of entry-byte entries (one token's layer
// entry); a span's runs are whole entries.
func CopySpan(dst []byte, ds kvlayout.Span, src []byte, ss kvlayout.Span, entry int64) {
	n := ds.Bytes()
	switch {
	case ds.Contiguous() && ss.Contiguous():
		copyRun(dst[ds.Offset:ds.Offset+n], src[ss.Offset:ss.Offset+n])
	case ds.Contiguous():
		d := ds.Offset
		for r := 0; r < ss.Count; r++ {
			s := ss.Offset + int64(r)*ss.Stride
			copyRun(dst[d:d+ss.RunBytes], src[s:s+ss.RunBytes])
			d += ss.RunBytes
		}
	case ss.Contiguous():
		s := ss.Offset
		for r := 0; r < ds.Count; r++ {
			d := ds.Offset + int64(r)*ds.Stride
			copyRun(dst[d:d+ds.RunBytes], src[s:s+ds.RunBytes])
			s += ds.RunBytes
		}
	case ds.RunBytes == ss.RunBytes:
		for r := 0; r < ds.Count; r++ {
			d := ds.Offset + int64(r)*ds.Stride
			s := ss.Offset + int64(r)*ss.Stride
			copyRun(dst[d:d+ds.RunBytes], src[s:s+ss.RunBytes])
		}
	default:
		for off := int64(0); off < n; off += entry {
			d := spanAt(ds, off)
			s := spanAt(ss, off)
			copy(dst[d:d+entry], src[s:s+entry])
		}
	}
	finishRuns()
}

// spanAt is the address of the byte at logical offset off within span s.
func spanAt(s kvlayout.Span, off int64) int64 {
	if s.Count == 1 {
		return s.Offset + off
	}
	return s.Offset + (off/s.RunBytes)*s.Stride + off%s.RunBytes
}
