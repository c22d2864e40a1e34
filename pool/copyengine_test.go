package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/kvlayout"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// patternByte is the byte i of the layer entry of token tok (a logical page's
// token) in buffer buf of layer of pool.
func patternByte(pool, buf, layer, logical, tok, i int) byte {
	return byte(pool*131 + buf*61 + layer*29 + logical*17 + tok*7 + i*3 + 1)
}

// fillDevice writes the pattern of logical page lp into device page dp of every pool.
func fillDevice(dev DeviceGroup, dp PageID, lp int) {
	for pi, p := range dev.Pools {
		m := p.(*MemDevicePool)
		l := m.Layout()
		tlb := l.Geometry.TokenLayerBytes()
		for buf := 0; buf < l.Geometry.Buffers(); buf++ {
			for layer := 0; layer < l.Geometry.Layers; layer++ {
				for tok := 0; tok < l.PageSize; tok++ {
					off := l.Offset(buf, layer, int(dp)*l.PageSize+tok)
					for i := 0; i < tlb; i++ {
						m.Bytes()[off+int64(i)] = patternByte(pi, buf, layer, lp, tok, i)
					}
				}
			}
		}
	}
}

// checkDevice reports the first byte of device page dp that does not hold logical
// page lp's pattern, for the given pools and layers (all when layers < 0).
func checkDevice(t *testing.T, dev DeviceGroup, dp PageID, lp int) {
	t.Helper()
	for pi, p := range dev.Pools {
		m := p.(*MemDevicePool)
		l := m.Layout()
		tlb := l.Geometry.TokenLayerBytes()
		for buf := 0; buf < l.Geometry.Buffers(); buf++ {
			for layer := 0; layer < l.Geometry.Layers; layer++ {
				for tok := 0; tok < l.PageSize; tok++ {
					off := l.Offset(buf, layer, int(dp)*l.PageSize+tok)
					for i := 0; i < tlb; i++ {
						if got, want := m.Bytes()[off+int64(i)], patternByte(pi, buf, layer, lp, tok, i); got != want {
							t.Fatalf("pool %s device page %d (logical %d) buf %d layer %d token %d byte %d = %d, want %d",
								p.Name(), dp, lp, buf, layer, tok, i, got, want)
						}
					}
				}
			}
		}
	}
}

func newEngine(t *testing.T, workers int) *CopyEngine {
	t.Helper()
	e, err := NewCopyEngine(CopyConfig{Workers: workers, MinPagesPerJob: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

func newGroups(t *testing.T, hostKind, devKind kvlayout.Kind, geoms []kvlayout.Geometry, hostPages, devPages int) (*Group, DeviceGroup) {
	t.Helper()
	a := testAllocator(t, hostmem.Mmap)
	names := []string{"kv", "draft", "draft2"}
	var pools []PoolSpec
	for i, g := range geoms {
		pools = append(pools, PoolSpec{Name: names[i], Geometry: g})
	}
	host, err := BuildGroup(GroupSpec{Pools: pools, Layout: hostKind, PageSize: 4, Pages: hostPages}, a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close() })
	dev, closeDev, err := NewMemDeviceGroup(GroupSpec{Pools: pools, Layout: devKind, PageSize: 4, Pages: devPages}, a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDev() })
	return host, dev
}

// Back up device pages to host pages, scramble the device, load them back into
// other device pages: every byte of every pool, layer and buffer must come home, for
// every pair of layouts.
func TestBackupAndLoadRoundTripEveryLayoutPair(t *testing.T) {
	kinds := []kvlayout.Kind{kvlayout.LayerFirst, kvlayout.PageFirst, kvlayout.PageFirstDirect}
	for _, geoms := range [][]kvlayout.Geometry{{testTarget, testDraft}, {testMLA}} {
		for _, hk := range kinds {
			for _, dk := range kinds {
				host, dev := newGroups(t, hk, dk, geoms, 6, 8)
				e := newEngine(t, 2)
				ctx := context.Background()
				for p := 0; p < 8; p++ {
					fillDevice(dev, PageID(p), p)
				}
				backup := []PageMove{{Device: 1, Host: 5}, {Device: 3, Host: 0}, {Device: 6, Host: 2}}
				tr, err := e.Backup(dev, host, backup)
				if err != nil {
					t.Fatal(err)
				}
				if err := tr.Wait(ctx); err != nil {
					t.Fatal(err)
				}
				for p := 0; p < 8; p++ {
					fillDevice(dev, PageID(p), 100+p)
				}
				load := []PageMove{{Device: 7, Host: 5}, {Device: 0, Host: 0}, {Device: 4, Host: 2}}
				tr, err = e.Load(dev, host, load)
				if err != nil {
					t.Fatal(err)
				}
				if err := tr.Wait(ctx); err != nil {
					t.Fatal(err)
				}
				checkDevice(t, dev, 7, 1)
				checkDevice(t, dev, 0, 3)
				checkDevice(t, dev, 4, 6)
				// Pages that were not loaded keep their bytes.
				checkDevice(t, dev, 5, 105)
				if tr.Elapsed() <= 0 || tr.Pages() != 3 || tr.Direction() != Load {
					t.Fatalf("transfer bookkeeping: %v %d %v", tr.Elapsed(), tr.Pages(), tr.Direction())
				}
			}
		}
	}
}

// gatedDevice blocks LoadLayer of one layer until released, to observe per-layer
// completion.
type gatedDevice struct {
	*MemDevicePool
	gateLayer int
	gate      chan struct{}
}

func (g *gatedDevice) LoadLayer(layer int, host *HostPool, moves []PageMove) error {
	if layer == g.gateLayer {
		<-g.gate
	}
	return g.MemDevicePool.LoadLayer(layer, host, moves)
}

func TestLayersCompleteInOrderBeforeTheWhole(t *testing.T) {
	host, dev := newGroups(t, kvlayout.PageFirst, kvlayout.LayerFirst, []kvlayout.Geometry{testTarget}, 4, 4)
	gd := &gatedDevice{MemDevicePool: dev.Pools[0].(*MemDevicePool), gateLayer: 2, gate: make(chan struct{})}
	dev.Pools[0] = gd
	e := newEngine(t, 1)
	tr, err := e.Load(dev, host, []PageMove{{0, 0}, {1, 1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.WaitLayer(ctx, 0, 0); err != nil {
		t.Fatalf("layer 0: %v", err)
	}
	if err := tr.WaitLayer(ctx, 0, 1); err != nil {
		t.Fatalf("layer 1: %v", err)
	}
	select {
	case <-tr.Done():
		t.Fatal("transfer done while layer 2 is held")
	default:
	}
	short, cancelShort := context.WithCancel(context.Background())
	cancelShort()
	if err := tr.WaitLayer(short, 0, 2); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait on held layer with a canceled context: %v", err)
	}
	close(gd.gate)
	if err := tr.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tr.WaitLayer(ctx, 0, 9); !errors.Is(err, ErrConfig) {
		t.Fatalf("wait on a layer that does not exist: %v", err)
	}
}

// Pools of one geometry are told apart only by name: a device group in another
// order than the host group, or with a pool the host group does not have, would
// copy one pool's KV into another's. Validate, the copy engine and a device pool's
// own copies refuse the pairing.
func TestPairingRefusesPoolsOfAnotherName(t *testing.T) {
	same := []kvlayout.Geometry{testTarget, testTarget}
	host, dev := newGroups(t, kvlayout.PageFirst, kvlayout.LayerFirst, same, 4, 4)
	if err := dev.Validate(host); err != nil {
		t.Fatalf("matching groups: %v", err)
	}
	swapped := DeviceGroup{Pools: []DevicePool{dev.Pools[1], dev.Pools[0]}, Pages: dev.Pages}
	a := testAllocator(t, hostmem.Mmap)
	renamed, closeRenamed, err := NewMemDeviceGroup(GroupSpec{
		Pools:  []PoolSpec{{Name: "kv", Geometry: testTarget}, {Name: "other", Geometry: testTarget}},
		Layout: kvlayout.LayerFirst, PageSize: 4, Pages: 4,
	}, a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeRenamed() })
	e := newEngine(t, 2)
	for _, c := range []struct {
		name string
		dev  DeviceGroup
		want string // the names the error must give
	}{
		{"pools in another order", swapped, `device pool "draft" paired with host pool "kv"`},
		{"a pool of another name", renamed, `device pool "other" paired with host pool "draft"`},
	} {
		err := c.dev.Validate(host)
		if !errors.Is(err, ErrMismatch) || !strings.Contains(fmt.Sprint(err), c.want) {
			t.Errorf("%s: Validate = %v; want ErrMismatch naming %s", c.name, err, c.want)
		}
		if _, err := e.Load(c.dev, host, []PageMove{{0, 0}}); !errors.Is(err, ErrMismatch) {
			t.Errorf("%s: Load = %v; want ErrMismatch", c.name, err)
		}
		if _, err := e.Backup(c.dev, host, []PageMove{{0, 0}}); !errors.Is(err, ErrMismatch) {
			t.Errorf("%s: Backup = %v; want ErrMismatch", c.name, err)
		}
	}
	// A device pool asked to copy with a host pool of another name refuses too.
	kv, draft := dev.Pools[0].(*MemDevicePool), host.Pool("draft")
	if err := kv.LoadLayer(0, draft, []PageMove{{0, 0}}); !errors.Is(err, ErrMismatch) {
		t.Errorf("LoadLayer of pool kv from host pool draft: %v", err)
	}
	if err := kv.BackupLayers(0, 1, draft, []PageMove{{0, 0}}); !errors.Is(err, ErrMismatch) {
		t.Errorf("BackupLayers of pool kv into host pool draft: %v", err)
	}
}

type failingDevice struct{ *MemDevicePool }

func (f failingDevice) LoadLayer(layer int, host *HostPool, moves []PageMove) error {
	if layer == 1 {
		return errors.New("device lost")
	}
	return f.MemDevicePool.LoadLayer(layer, host, moves)
}

func TestBadTransfersAreRefusedOrReported(t *testing.T) {
	host, dev := newGroups(t, kvlayout.PageFirst, kvlayout.LayerFirst, []kvlayout.Geometry{testTarget, testDraft}, 4, 4)
	e := newEngine(t, 2)
	ctx := context.Background()
	if _, err := e.Load(dev, host, []PageMove{{Device: 4, Host: 0}}); !errors.Is(err, ErrForeignPage) {
		t.Fatalf("device page out of range: %v", err)
	}
	if _, err := e.Load(dev, host, []PageMove{{Device: 0, Host: -1}}); !errors.Is(err, ErrForeignPage) {
		t.Fatalf("host page out of range: %v", err)
	}
	swapped := DeviceGroup{Pools: []DevicePool{dev.Pools[1], dev.Pools[0]}, Pages: dev.Pages}
	if _, err := e.Load(swapped, host, []PageMove{{0, 0}}); !errors.Is(err, ErrMismatch) {
		t.Fatalf("pools in the wrong order: %v", err)
	}
	if _, err := e.Load(DeviceGroup{Pools: dev.Pools[:1], Pages: dev.Pages}, host, nil); !errors.Is(err, ErrMismatch) {
		t.Fatalf("missing draft pool: %v", err)
	}
	other, _ := newGroups(t, kvlayout.PageFirst, kvlayout.LayerFirst, []kvlayout.Geometry{testMLA, testDraft}, 4, 4)
	if _, err := e.Load(dev, other, nil); !errors.Is(err, ErrMismatch) {
		t.Fatalf("geometry mismatch: %v", err)
	}
	failing := DeviceGroup{Pools: []DevicePool{failingDevice{dev.Pools[0].(*MemDevicePool)}, dev.Pools[1]}, Pages: dev.Pages}
	tr, err := e.Load(failing, host, []PageMove{{0, 0}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Wait(ctx); err == nil || !errors.Is(tr.Err(), err) {
		t.Fatalf("failing device: %v", err)
	}
	// A transfer of nothing completes.
	tr, err = e.Load(dev, host, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestCloseFailsQueuedTransfers(t *testing.T) {
	host, dev := newGroups(t, kvlayout.PageFirst, kvlayout.LayerFirst, []kvlayout.Geometry{testTarget}, 4, 4)
	gd := &gatedDevice{MemDevicePool: dev.Pools[0].(*MemDevicePool), gateLayer: 0, gate: make(chan struct{})}
	dev.Pools[0] = gd
	e, err := NewCopyEngine(CopyConfig{Workers: 1, MinPagesPerJob: 1})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := e.Load(dev, host, []PageMove{{0, 0}})
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() { e.Close(); close(closed) }()
	// Release layer 0 only once Close has marked the engine closed.
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.mu.Lock()
		c := e.closed
		e.mu.Unlock()
		if c {
			break
		}
		if time.Now().After(deadline) {
			close(gd.gate)
			t.Fatal("Close did not mark the engine closed within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	close(gd.gate)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return within 10s of the running job's end")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.Wait(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("queued layers after Close: %v", err)
	}
	if _, err := e.Load(dev, host, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("load after Close: %v", err)
	}
	e.Close()
}

// enteredDevice is a gatedDevice that says when the held layer's copy has started.
type enteredDevice struct {
	*gatedDevice
	entered chan struct{}
	once    sync.Once
}

func (d *enteredDevice) LoadLayer(layer int, host *HostPool, moves []PageMove) error {
	if layer == d.gateLayer {
		d.once.Do(func() { close(d.entered) })
	}
	return d.gatedDevice.LoadLayer(layer, host, moves)
}

// A transfer canceled while its first layer copies finishes that layer and skips
// the layers queued behind it: they are not copied, and Wait says so.
func TestCancelSkipsQueuedLayers(t *testing.T) {
	host, dev := newGroups(t, kvlayout.PageFirst, kvlayout.LayerFirst, []kvlayout.Geometry{testTarget}, 4, 4)
	m := dev.Pools[0].(*MemDevicePool)
	gd := &enteredDevice{gatedDevice: &gatedDevice{MemDevicePool: m, gateLayer: 0, gate: make(chan struct{})}, entered: make(chan struct{})}
	dev.Pools[0] = gd
	e := newEngine(t, 1)
	hb := host.Target().Bytes()
	for i := range hb {
		hb[i] = 0xa5
	}
	before := slices.Clone(m.Bytes())
	tr, err := e.Load(dev, host, []PageMove{{0, 0}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-gd.entered:
	case <-time.After(10 * time.Second):
		close(gd.gate)
		t.Fatal("layer 0's copy did not start within 10s")
	}
	tr.Cancel()
	close(gd.gate)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled transfer: %v", err)
	}
	l := m.Layout()
	layerBytes := int64(l.Geometry.Buffers() * l.PageSize * l.Geometry.TokenLayerBytes())
	if s := e.Stats(); s.CopiedBytes != layerBytes {
		t.Fatalf("copied %d bytes after the cancel; want layer 0's %d alone", s.CopiedBytes, layerBytes)
	}
	// The host page holds 0xa5 everywhere: layer 0 arrived, the others did not.
	n := int64(l.PageSize * l.Geometry.TokenLayerBytes())
	for buf := 0; buf < l.Geometry.Buffers(); buf++ {
		for layer := 0; layer < l.Geometry.Layers; layer++ {
			off := l.Offset(buf, layer, 0)
			got, want := m.Bytes()[off:off+n], before[off:off+n]
			if layer == 0 {
				want = hb[:n]
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("buffer %d layer %d of the device page after the cancel: copied %v, want %v", buf, layer, layer != 0, layer == 0)
			}
		}
	}
}

func TestConcurrentTransfers(t *testing.T) {
	host, dev := newGroups(t, kvlayout.PageFirst, kvlayout.LayerFirst, []kvlayout.Geometry{testTarget, testDraft}, 32, 32)
	e := newEngine(t, 3)
	for p := 0; p < 32; p++ {
		fillDevice(dev, PageID(p), p)
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			moves := []PageMove{{PageID(4 * g), PageID(4 * g)}, {PageID(4*g + 1), PageID(4*g + 1)}}
			tr, err := e.Backup(dev, host, moves)
			if err != nil {
				t.Error(err)
				return
			}
			if err := tr.Wait(context.Background()); err != nil {
				t.Error(err)
				return
			}
			back := []PageMove{{PageID(4*g + 2), PageID(4 * g)}, {PageID(4*g + 3), PageID(4*g + 1)}}
			tr, err = e.Load(dev, host, back)
			if err != nil {
				t.Error(err)
				return
			}
			if err := tr.Wait(context.Background()); err != nil {
				t.Error(err)
			}
		}(g)
	}
	wg.Wait()
	for g := 0; g < 8; g++ {
		checkDevice(t, dev, PageID(4*g+2), 4*g)
		checkDevice(t, dev, PageID(4*g+3), 4*g+1)
	}
	if s := e.Stats(); s.Transfers != 16 || s.CopiedBytes == 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestCopyEngineConfig(t *testing.T) {
	for _, cfg := range []CopyConfig{{Workers: 0, MinPagesPerJob: 1}, {Workers: 1, MinPagesPerJob: 0}} {
		if _, err := NewCopyEngine(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}
