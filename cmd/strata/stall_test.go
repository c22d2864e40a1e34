package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
	"github.com/stratakv/strata/storage/nodeclient"
)

// A call of the Go node client that gives up while the service is stopped
// (SIGSTOP) must leave the engine's memory alone once it has returned: the
// engine reuses those pages at once. Before, the resumed service stored a
// put's page as it was by then (another prefix's KV under the old key) and
// wrote a get's object over the page another request had been given.
func TestNodeClientCallsThatGaveUpLeaveMemoryAlone(t *testing.T) {
	socket := filepath.Join(shortDir(t), "s")
	serve := startServe(t, socket, t.TempDir())
	b, p := nodeClientPool(t, socket, 8, 16)
	ctx := context.Background()
	fill := func(page pool.PageID, v byte) {
		for buf := 0; buf < p.Layout().Geometry.Buffers(); buf++ {
			mem, _ := p.PageBuffer(buf, page)
			for i := range mem {
				mem[i] = v + byte(i%251)
			}
		}
	}
	holds := func(page pool.PageID, v byte) bool {
		for buf := 0; buf < p.Layout().Geometry.Buffers(); buf++ {
			mem, _ := p.PageBuffer(buf, page)
			for i := range mem {
				if mem[i] != v+byte(i%251) {
					return false
				}
			}
		}
		return true
	}
	h, _ := pagekey.New(pagekey.Config{PageSize: 1})
	ks := h.Keys(pagekey.Key{}, []uint32{11, 12, 13})
	fill(0, 1)
	if errs := b.Put(ctx, "kv", ks[:1], []pool.PageID{0}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	stopped := func(what string, call func(ctx context.Context) error, reuse func()) {
		t.Helper()
		before := handled(t, socket, -1)
		if err := serve.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		waitProcessState(t, serve.Process.Pid, 'T')
		resumed := false
		defer func() {
			if !resumed {
				_ = serve.Process.Signal(syscall.SIGCONT)
			}
		}()
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		start := time.Now()
		err := call(cctx)
		cancel()
		if !errors.Is(err, storage.ErrTimeout) {
			t.Fatalf("%s on a stopped service: %v, want a timeout", what, err)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Fatalf("%s on a stopped service took %v", what, took)
		}
		reuse() // the engine hands the pages to another request
		_ = serve.Process.Signal(syscall.SIGCONT)
		resumed = true
		handled(t, socket, before) // the resumed service has handled the request
	}
	stopped("get", func(ctx context.Context) error {
		return b.Get(ctx, "kv", ks[:1], []pool.PageID{1})[0]
	}, func() { fill(1, 77) })
	if !holds(1, 77) {
		t.Fatal("the resumed service wrote an object into a page the engine had reused after the get gave up")
	}
	fill(2, 5)
	stopped("put", func(ctx context.Context) error {
		return b.Put(ctx, "kv", ks[1:2], []pool.PageID{2})[0]
	}, func() { fill(2, 99) })
	fill(3, 0)
	if err := b.Get(ctx, "kv", ks[1:2], []pool.PageID{3})[0]; err == nil {
		which := "neither"
		switch {
		case holds(3, 99):
			which = "the reused page's new bytes"
		case holds(3, 5):
			which = "the bytes at the put's call"
		}
		t.Fatalf("a put that gave up on a stopped service was stored after it resumed (%s)", which)
	}
}

// handled waits until the service has handled more puts and gets than
// before, and returns the count (before < 0: the count now).
func handled(t *testing.T, socket string, before int64) int64 {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, _, err := fetchStats(ctx, socket)
		cancel()
		if n := st.Ops.Puts + st.Ops.Gets; err == nil && n > before {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("the resumed service never handled the request (err %v)", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitProcessState waits until process pid is in state (as /proc/PID/stat
// spells it: 'T' stopped): a signal takes effect a moment after kill returns.
func waitProcessState(t *testing.T, pid int, state byte) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if i := bytes.LastIndexByte(b, ')'); err == nil && i >= 0 && i+2 < len(b) && b[i+2] == state {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d never reached state %c", pid, state)
		}
	}
}

// nodeClientPool connects a Go node client to the service at socket and
// registers one host pool of pages pages of pageSize tokens (4 layers, 2 KV
// heads of 64, bf16: 2 KiB a token).
func nodeClientPool(t *testing.T, socket string, pages, pageSize int) (*nodeclient.Backend, *pool.HostPool) {
	t.Helper()
	cfg := nodeclient.DefaultConfig(socket)
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.CallTimeout = 20 * time.Second
	b, err := nodeclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	acfg := hostmem.DefaultConfig(hostmem.Mmap)
	acfg.ReserveBytes = 0
	alloc, err := storage.HostAllocator(b, acfg)
	if err != nil {
		t.Fatal(err)
	}
	g, err := pool.BuildGroup(pool.GroupSpec{
		Pools:  []pool.PoolSpec{{Name: "kv", Geometry: kvlayout.Geometry{Layers: 4, KVHeads: 2, HeadDim: 64, DTypeBytes: 2}}},
		Layout: kvlayout.PageFirst, PageSize: pageSize, Pages: pages,
	}, alloc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	p := g.Pools()[0]
	if err := b.RegisterPool(ctx, storage.SpecOf(p, pagekey.Names{})); err != nil {
		t.Fatal(err)
	}
	return b, p
}
