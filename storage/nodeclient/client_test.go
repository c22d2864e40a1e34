package nodeclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/node"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
	"github.com/stratakv/strata/storage/storagetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

// socketDir is a short directory for sockets: Unix socket paths hold 107 bytes.
func socketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func startServer(t *testing.T, socket string, tweak func(*node.Config)) *node.Server {
	t.Helper()
	cfg := node.DefaultConfig(socket)
	cfg.ArenaBytes = 64 << 20
	cfg.Admin = ""
	cfg.Logger = quiet
	acfg := hostmem.DefaultConfig(hostmem.Mmap)
	acfg.ReserveBytes = 0
	acfg.Logger = quiet
	alloc, err := hostmem.New(acfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Allocator = alloc
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newClient(t *testing.T, socket string) *Backend {
	t.Helper()
	cfg := DefaultConfig(socket)
	cfg.Logger = quiet
	cfg.CallTimeout = 20 * time.Second // no test waits for a timeout; a busy CI machine must not hit one
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestConformance(t *testing.T) {
	var mu sync.Mutex
	servers := map[string]string{}
	storagetest.Run(t, func(t *testing.T, shared string) storage.Backend {
		mu.Lock()
		socket, ok := servers[shared]
		if !ok {
			socket = filepath.Join(socketDir(t), "s")
			s := startServer(t, socket, func(c *node.Config) { c.SpillDir = t.TempDir() })
			t.Cleanup(func() { s.Close() })
			servers[shared] = socket
		}
		mu.Unlock()
		return newClient(t, socket)
	})
}

func testGroup(t *testing.T, b storage.Backend, pages int) *pool.Group {
	return buildGroup(t, b, pool.GroupSpec{
		Pools: []pool.PoolSpec{
			{Name: "kv", Geometry: kvlayout.Geometry{Layers: 2, KVHeads: 2, HeadDim: 32, DTypeBytes: 2}},
			{Name: "draft", Geometry: kvlayout.Geometry{Layers: 1, KVHeads: 2, HeadDim: 32, DTypeBytes: 2}},
		},
		Layout: kvlayout.PageFirst, PageSize: 8, Pages: pages,
	})
}

// buildGroup builds spec's pools in host memory b can register, closed when
// the test ends.
func buildGroup(t *testing.T, b storage.Backend, spec pool.GroupSpec) *pool.Group {
	t.Helper()
	acfg := hostmem.DefaultConfig(hostmem.Mmap)
	acfg.ReserveBytes = 0
	alloc, err := storage.HostAllocator(b, acfg)
	if err != nil {
		t.Fatal(err)
	}
	g, err := pool.BuildGroup(spec, alloc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

func keys(n int) []pagekey.Key {
	h, _ := pagekey.New(pagekey.Config{PageSize: 1})
	tokens := make([]uint32, n)
	for i := range tokens {
		tokens[i] = uint32(i*7 + 1)
	}
	return h.Keys(pagekey.Key{}, tokens)
}

func fill(g *pool.Group, page pool.PageID, v byte) {
	for _, p := range g.Pools() {
		for buf := 0; buf < p.Layout().Geometry.Buffers(); buf++ {
			b, _ := p.PageBuffer(buf, page)
			for i := range b {
				b[i] = v + byte(i)
			}
		}
	}
}

// samePage reports whether host page a and host page b hold the same bytes in
// every pool of g.
func samePage(g *pool.Group, a, b pool.PageID) error {
	for _, p := range g.Pools() {
		for buf := 0; buf < p.Layout().Geometry.Buffers(); buf++ {
			x, _ := p.PageBuffer(buf, a)
			y, _ := p.PageBuffer(buf, b)
			if !bytes.Equal(x, y) {
				return fmt.Errorf("pool %q buffer %d: page %d differs from page %d", p.Name(), buf, b, a)
			}
		}
	}
	return nil
}

// The service restarts under a client, several times: calls fail fast while it
// is gone, and the client reconnects and registers its pools again by itself,
// each pool under its own segment: what every pool puts after a restart reads
// back byte for byte into that pool.
func TestReconnectAfterRestart(t *testing.T) {
	socket := filepath.Join(socketDir(t), "s")
	s := startServer(t, socket, nil)
	t.Cleanup(func() { s.Close() }) // the last one; Close is idempotent
	b := newClient(t, socket)
	defer b.Close()
	g := testGroup(t, b, 16)
	ctx := context.Background()
	for _, p := range g.Pools() {
		if err := b.RegisterPool(ctx, storage.SpecOf(p, pagekey.Names{})); err != nil {
			t.Fatal(err)
		}
	}
	ks := keys(8)
	// roundTrip puts host page src of every pool as key k and reads it back into
	// page dst, cleared first.
	roundTrip := func(what string, k pagekey.Key, src, dst pool.PageID, v byte) {
		t.Helper()
		fill(g, src, v)
		fill(g, dst, 0)
		for _, p := range g.Pools() {
			if errs := b.Put(ctx, p.Name(), []pagekey.Key{k}, []pool.PageID{src}); errs[0] != nil {
				t.Fatalf("%s: put into %s: %v", what, p.Name(), errs[0])
			}
		}
		for _, p := range g.Pools() {
			if errs := b.Get(ctx, p.Name(), []pagekey.Key{k}, []pool.PageID{dst}); errs[0] != nil {
				t.Fatalf("%s: get from %s: %v", what, p.Name(), errs[0])
			}
		}
		if err := samePage(g, src, dst); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	roundTrip("before any restart", ks[0], 0, 1, 1)
	if e := b.Epoch(); e != 1 {
		t.Fatalf("Epoch = %d on the first connection, want 1", e)
	}
	const restarts = 3
	for r := 1; r <= restarts; r++ {
		s.Close()
		// While it is down: fast failures, no hang.
		deadline := time.Now().Add(5 * time.Second)
		for {
			_, err := b.Exists(ctx, "kv", ks[:1])
			if errors.Is(err, storage.ErrUnavailable) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("exists with the service down: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if errs := b.Get(ctx, "draft", ks[:1], []pool.PageID{2}); !errors.Is(errs[0], storage.ErrUnavailable) {
			t.Fatalf("get with the service down: %v", errs[0])
		}
		s = startServer(t, socket, nil)
		wait, cancel := context.WithTimeout(ctx, 10*time.Second)
		for b.Epoch() != uint64(r+1) {
			if wait.Err() != nil {
				t.Fatalf("client did not reconnect after restart %d (epoch %d)", r, b.Epoch())
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := b.WaitConnected(wait); err != nil {
			t.Fatal(err)
		}
		cancel()
		if got := b.ContentEpoch(); got != uint64(r) {
			t.Fatalf("ContentEpoch %d after cold restart %d", got, r)
		}
		// The new service is empty: what the old one held is a miss.
		for _, p := range g.Pools() {
			if errs := b.Get(ctx, p.Name(), ks[:1], []pool.PageID{2}); !errors.Is(errs[0], storage.ErrNotFound) {
				t.Fatalf("restart %d: get from %s of a key of the old service: %v, want ErrNotFound", r, p.Name(), errs[0])
			}
		}
		roundTrip(fmt.Sprintf("after restart %d", r), ks[r], pool.PageID(2*r+2), pool.PageID(2*r+3), byte(16*r))
		st := s.Stats()
		if len(st.Clients) != 1 || len(st.Clients[0].Segments) != len(g.Pools()) {
			t.Fatalf("after restart %d the service sees %+v", r, st.Clients)
		}
	}
	s.Close()
}

func TestMmapPoolsAreRefusedWithAdvice(t *testing.T) {
	socket := filepath.Join(socketDir(t), "s")
	s := startServer(t, socket, nil)
	defer s.Close()
	b := newClient(t, socket)
	defer b.Close()
	alloc, _ := hostmem.New(hostmem.Config{Kind: hostmem.Mmap})
	g, err := pool.BuildGroup(pool.GroupSpec{Pools: []pool.PoolSpec{{Name: "kv", Geometry: kvlayout.Geometry{Layers: 1, KVHeads: 1, HeadDim: 8, DTypeBytes: 2}}},
		Layout: kvlayout.PageFirst, PageSize: 4, Pages: 4}, alloc)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	err = b.RegisterPool(context.Background(), storage.SpecOf(g.Target(), pagekey.Names{}))
	if !errors.Is(err, storage.ErrRegistration) || !contains(err.Error(), "HostAllocator") {
		t.Fatalf("mmap pool: %v", err)
	}
}

func contains(s, sub string) bool {
	return len(s) >= len(sub) && (s == sub || len(sub) == 0 || indexOf(s, sub) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// A pool whose object names the wire would refuse (a model prefix that is not
// printable ASCII, or too long for keys of wire.MaxKey bytes) is refused when it
// registers, by the wire's own rule; a Hugging Face model id as the prefix is a
// valid key.
func TestPoolKeysFollowTheWireRule(t *testing.T) {
	socket := filepath.Join(socketDir(t), "s")
	s := startServer(t, socket, nil)
	defer s.Close()
	b := newClient(t, socket)
	defer b.Close()
	g := testGroup(t, b, 4)
	ctx := context.Background()
	for _, prefix := range []string{"modèle", strings.Repeat("p", wire.MaxKey), "tab\there"} {
		err := b.RegisterPool(ctx, storage.SpecOf(g.Pool("kv"), pagekey.Names{ModelPrefix: prefix}))
		if !errors.Is(err, storage.ErrConfig) || !contains(err.Error(), "printable ASCII") {
			t.Errorf("model prefix %.20q: %v", prefix, err)
		}
	}
	if err := b.RegisterPool(ctx, storage.SpecOf(g.Pool("kv"), pagekey.Names{ModelPrefix: "meta-llama/Llama 3.1 8B"})); err != nil {
		t.Fatalf("a Hugging Face model id as the prefix: %v", err)
	}
	if err := b.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	fill(g, 0, 5)
	ks := keys(1)
	if errs := b.Put(ctx, "kv", ks, []pool.PageID{0}); errs[0] != nil {
		t.Fatalf("put: %v", errs[0])
	}
	if errs := b.Get(ctx, "kv", ks, []pool.PageID{1}); errs[0] != nil {
		t.Fatalf("get: %v", errs[0])
	}
	kv := g.Pool("kv")
	for buf := 0; buf < kv.Layout().Geometry.Buffers(); buf++ {
		x, _ := kv.PageBuffer(buf, 0)
		y, _ := kv.PageBuffer(buf, 1)
		if !bytes.Equal(x, y) {
			t.Fatalf("buffer %d read back other bytes", buf)
		}
	}
}

// A warm restart (the service re-attached its arena file) keeps the client's
// ContentEpoch; a restart that lost the arena moves it, which tells a cache to
// store again what it holds.
func TestContentEpochMovesOnlyOnAColdRestart(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("no /dev/shm for an arena file")
		}
		t.Skip("no /dev/shm for an arena file")
	}
	dir, err := os.MkdirTemp("/dev/shm", "strata-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket := filepath.Join(socketDir(t), "s")
	file := func(c *node.Config) { c.ArenaFile = filepath.Join(dir, "arena") }
	s := startServer(t, socket, file)
	t.Cleanup(func() { s.Close() })
	b := newClient(t, socket)
	defer b.Close()
	restart := func(tweak func(*node.Config)) {
		t.Helper()
		epoch := b.Epoch()
		s.Close()
		s = startServer(t, socket, tweak)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for b.Epoch() == epoch {
			if ctx.Err() != nil {
				t.Fatal("the client did not reconnect")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	restart(file)
	if got := b.ContentEpoch(); got != 0 {
		t.Fatalf("ContentEpoch %d after a warm restart, want 0", got)
	}
	restart(nil) // anonymous memory: a cold start
	if got := b.ContentEpoch(); got != 1 {
		t.Fatalf("ContentEpoch %d after a cold restart, want 1", got)
	}
}
