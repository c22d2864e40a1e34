package nodeclient

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// recv waits for ch, or fails the test after 10 s.
func recv(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func poolSpec(g *pool.Group, name string) storage.PoolSpec {
	for _, p := range g.Pools() {
		if p.Name() == name {
			return storage.SpecOf(p, pagekey.Names{})
		}
	}
	panic("no pool " + name)
}

// The connection dies while the client registers a pool that was added during
// the handshake. The client used to mark that dead connection ready anyway,
// closing the channel meant for the next connection, and panicked with "close
// of closed channel" when the next connection was ready.
func TestConnectionLostWhileRegisteringAPool(t *testing.T) {
	socket := filepath.Join(socketDir(t), "s")
	f := startFake(t, socket)
	helloGo := make(chan struct{})
	kvSeen, kvGo := make(chan struct{}), make(chan struct{})
	releaseHello, releaseKV := sync.OnceFunc(func() { close(helloGo) }), sync.OnceFunc(func() { close(kvGo) })
	t.Cleanup(releaseHello) // before the fake closes: its sessions may wait on these
	t.Cleanup(releaseKV)
	f.onHello = func(n int) {
		if n == 0 {
			<-helloGo
		}
	}
	f.onRegister = func(n int, name string) bool {
		if n > 0 {
			return false
		}
		if name == "kv" {
			close(kvSeen)
			<-kvGo
			return false
		}
		return true // the pool added during the handshake: the connection dies
	}
	f.serve()

	cfg := DefaultConfig(socket)
	cfg.Logger = quiet
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	g := testGroup(t, b, 8)
	ctx := context.Background()
	// The first Hello is held: the client is not connected, kv waits for it.
	if err := b.RegisterPool(ctx, poolSpec(g, "kv")); err != nil {
		t.Fatal(err)
	}
	releaseHello()
	recv(t, "the first connection to register kv", kvSeen)
	// Added while kv is being registered, before the connection is published:
	// the client registers it once the connection is up, and the connection dies.
	if err := b.RegisterPool(ctx, poolSpec(g, "draft")); err != nil {
		t.Fatal(err)
	}
	releaseKV()

	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := b.WaitConnected(wait); err != nil {
		t.Fatal(err)
	}
	if n := f.connections(); n != 2 {
		t.Fatalf("the client is ready after %d connections, want 2 (the first died registering draft)", n)
	}
	if e := b.Epoch(); e != 1 {
		t.Fatalf("Epoch = %d after one connection that got ready, want 1", e)
	}
	if reg := f.registered(1); len(reg) != 2 || reg["kv"] == 0 || reg["draft"] == 0 {
		t.Fatalf("the second connection registered %v, want kv and draft", reg)
	}
	ks := keys(2)
	for _, name := range []string{"kv", "draft"} {
		if errs := b.Put(ctx, name, ks, []pool.PageID{0, 1}); errs[0] != nil || errs[1] != nil {
			t.Fatalf("put into %s: %v", name, errs)
		}
	}
	if err := f.problems(); err != nil {
		t.Fatal(err)
	}
}

// A request is built from the segment ids of one connection. When that
// connection is replaced before the request is sent, the pools may have come
// back under each other's ids (the service numbers segments per connection, in
// the order the client registers them); the request must be rebuilt for the
// new connection, never sent on it as built, or a Get would copy one pool's
// pages into another pool's memory.
func TestRequestForALostConnectionIsNotSentOnTheNext(t *testing.T) {
	socket := filepath.Join(socketDir(t), "s")
	f := startFake(t, socket)
	// Connections 0, 2, 4... number kv 1 and draft 2; the others the other way round.
	f.segmentID = func(n int, name string) uint32 {
		id := uint32(1)
		if name == "draft" {
			id = 2
		}
		if n%2 == 1 {
			id = 3 - id
		}
		return id
	}
	f.serve()
	b := newClient(t, socket)
	defer b.Close()
	g := testGroup(t, b, 8)
	ctx := context.Background()
	for _, name := range []string{"kv", "draft"} {
		if err := b.RegisterPool(ctx, poolSpec(g, name)); err != nil {
			t.Fatal(err)
		}
	}
	// The hook runs between building a request and sending it; armed, it drops
	// the connection and waits until the client is back on a new one.
	armed := false
	b.hooks.beforeSend = func() {
		if !armed {
			return
		}
		armed = false
		n, epoch := f.connections()-1, b.Epoch()
		f.drop(n)
		waitFor(t, "the client to reconnect", func() bool { return b.Epoch() > epoch })
	}
	ks := keys(3)
	for i, op := range []struct {
		what string
		pool string
		call func(context.Context, string, []pagekey.Key, []pool.PageID) []error
	}{
		{"put", "draft", b.Put},
		{"get", "kv", b.Get},
		{"get", "draft", b.Get},
	} {
		armed = true
		errs := op.call(ctx, op.pool, ks, []pool.PageID{0, 1, 2})
		for k, err := range errs {
			if err != nil {
				t.Fatalf("%s %s across a reconnect, key %d: %v", op.what, op.pool, k, err)
			}
		}
		if got := f.connections(); got != i+2 {
			t.Fatalf("%d connections after %d forced reconnects", got, i+1)
		}
		if f.served(i+1) != 1 {
			t.Fatalf("%s %s: the new connection served %d requests, want the rebuilt one", op.what, op.pool, f.served(i+1))
		}
	}
	if err := f.problems(); err != nil {
		t.Fatal(err)
	}
}

// After a restart the client is back within the backoff's ceiling, and the
// default ceiling keeps that well under a second.
func TestDefaultBackoffStaysUnderHalfASecond(t *testing.T) {
	cfg := DefaultConfig("/unused")
	d := cfg.ReconnectMin
	for i := 0; i < 64; i++ {
		next := nextBackoff(d, cfg)
		if next < d || next > cfg.ReconnectMax {
			t.Fatalf("backoff %v after %v: want between it and the ceiling %v", next, d, cfg.ReconnectMax)
		}
		d = next
	}
	if d != cfg.ReconnectMax || cfg.ReconnectMax > 500*time.Millisecond {
		t.Fatalf("backoff settles at %v (ceiling %v): a restarted service would wait that long for its clients; want at most 500ms", d, cfg.ReconnectMax)
	}
}
