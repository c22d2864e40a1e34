package nodeclient

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// The client counts what it saw of an outage of the service: the loss, the
// failed attempts to connect, the calls refused meanwhile, the reconnect,
// and how long it was without a connection, which stops growing once it is
// back.
func TestStatsCountAnOutage(t *testing.T) {
	socket := filepath.Join(socketDir(t), "s")
	s := startServer(t, socket, nil)
	t.Cleanup(func() { s.Close() })
	b := newClient(t, socket)
	defer b.Close()
	g := testGroup(t, b, 8)
	ctx := context.Background()
	for _, p := range g.Pools() {
		if err := b.RegisterPool(ctx, storage.SpecOf(p, pagekey.Names{})); err != nil {
			t.Fatal(err)
		}
	}
	ks := keys(1)
	if errs := b.Put(ctx, "kv", ks, []pool.PageID{0}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if st := b.Stats(); !st.Connected || st.Connects != 1 || st.Reconnects != 0 || st.Disconnects != 0 ||
		st.RefusedCalls != 0 || st.LostCalls != 0 || st.Unreachable != 0 {
		t.Fatalf("before any outage: %+v", st)
	}
	s.Close()
	waitFor(t, "the client to see the service gone", func() bool { return !b.Stats().Connected })
	if _, err := b.Exists(ctx, "kv", ks); !errors.Is(err, storage.ErrUnavailable) {
		t.Fatalf("exists with the service down: %v", err)
	}
	if errs := b.Get(ctx, "draft", ks, []pool.PageID{1}); !errors.Is(errs[0], storage.ErrUnavailable) {
		t.Fatalf("get with the service down: %v", errs[0])
	}
	waitFor(t, "a failed attempt to connect", func() bool { return b.Stats().DialFailures > 0 })
	down := b.Stats()
	if down.Connected || down.Disconnects != 1 || down.RefusedCalls != 2 || down.Unreachable <= 0 ||
		down.LongestUnreachable != down.Unreachable {
		t.Fatalf("during the outage: %+v", down)
	}
	s = startServer(t, socket, nil)
	waitFor(t, "the client to reconnect", func() bool { return b.Epoch() == 2 })
	back := b.Stats()
	if !back.Connected || back.Connects != 2 || back.Reconnects != 1 || back.Disconnects != 1 || back.RefusedCalls != 2 ||
		back.Unreachable < down.Unreachable || back.LongestUnreachable != back.Unreachable {
		t.Fatalf("after the outage (during it: %+v): %+v", down, back)
	}
	if errs := b.Put(ctx, "kv", keys(2)[1:], []pool.PageID{2}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if again := b.Stats(); again.Unreachable != back.Unreachable || again.RefusedCalls != back.RefusedCalls {
		t.Fatalf("the outage is over, yet its figures moved: %+v, then %+v", back, again)
	}
}

// A call whose connection fails before its reply counts as lost, not
// refused: it reached the service, which may have done it.
func TestStatsCountALostCall(t *testing.T) {
	socket := filepath.Join(socketDir(t), "s")
	f := startFake(t, socket)
	f.onBatch = func(n int) bool { return n == 0 } // the first connection dies with its first batch
	f.serve()
	b := newClient(t, socket)
	defer b.Close()
	g := testGroup(t, b, 8)
	ctx := context.Background()
	if err := b.RegisterPool(ctx, poolSpec(g, "kv")); err != nil {
		t.Fatal(err)
	}
	if errs := b.Put(ctx, "kv", keys(1), []pool.PageID{0}); !errors.Is(errs[0], storage.ErrUnavailable) {
		t.Fatalf("put whose connection died before the reply: %v", errs[0])
	}
	waitFor(t, "the client to reconnect", func() bool { return b.Epoch() == 2 })
	if st := b.Stats(); st.LostCalls != 1 || st.RefusedCalls != 0 || st.Disconnects != 1 || st.Reconnects != 1 ||
		st.Unreachable <= 0 || st.Unreachable > time.Minute {
		t.Fatalf("after a lost call and a reconnect: %+v", st)
	}
}
