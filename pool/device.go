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

var _ DevicePool = (*MemDevicePool)(nil)

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
	return d.copyLayer(layer, host, moves, true)
}

// BackupLayer copies layer of each move's device page into its host page.
func (d *MemDevicePool) BackupLayer(layer int, host *HostPool, moves []PageMove) error {
	return d.copyLayer(layer, host, moves, false)
}

func (d *MemDevicePool) copyLayer(layer int, host *HostPool, moves []PageMove, load bool) error {
	if err := checkPair(d, host); err != nil {
		return err
	}
	if layer < 0 || layer >= d.layout.Geometry.Layers {
		return fmt.Errorf("pool %q: layer %d of %d: %w", d.name, layer, d.layout.Geometry.Layers, ErrConfig)
	}
	if err := checkMoves(moves, d.layout.Pages, host.layout.Pages); err != nil {
		return fmt.Errorf("pool %q: %w", d.name, err)
	}
	dev, hb := d.Bytes(), host.Bytes()
	entry := int64(d.layout.Geometry.TokenLayerBytes())
	for _, m := range moves {
		for buf := 0; buf < d.layout.Geometry.Buffers(); buf++ {
			ds := d.layout.PageLayerSpan(buf, layer, int(m.Device))
			hs := host.layout.PageLayerSpan(buf, layer, int(m.Host))
			if load {
				CopySpan(dev, ds, hb, hs, entry)
			} else {
				CopySpan(hb, hs, dev, ds, entry)
			}
		}
	}
	return nil
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
