package storagebench

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratakv/strata/node/wire"
)

// fakeStarting answers every Hello on socket as a service that says it is
// starting for its first `starting` connections and ready after.
func fakeStarting(t *testing.T, starting int32) (string, *atomic.Int32) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	var hellos atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			conn := wire.NewConn(c)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if h, _, _, err := conn.Recv(ctx); err == nil {
				n := hellos.Add(1)
				_ = conn.Send(ctx, wire.TypeHelloReply, h.ID, wire.HelloReply{ClientID: uint64(n), ServerVersion: "fake", MaxBatch: 4096,
					Starting: n <= starting, ReadyPercent: uint32(min(100, 30*n))})
			}
			cancel()
			_ = conn.Close()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
	})
	return sock, &hellos
}

// A run against a service that is still starting waits for it (the timed
// batches would otherwise measure its warm-up) and says what it first saw.
func TestAwaitSocketReadyWaitsOutTheStart(t *testing.T) {
	sock, hellos := fakeStarting(t, 3)
	var said []string
	waited, first, err := awaitSocketReady(context.Background(), sock, func(f string, a ...any) { said = append(said, f) })
	if err != nil {
		t.Fatal(err)
	}
	if got := hellos.Load(); got != 4 {
		t.Errorf("%d Hellos, want 4 (three starting, then ready)", got)
	}
	if first != 30 || waited <= 0 {
		t.Errorf("first readiness %d%%, waited %v", first, waited)
	}
	if len(said) == 0 || !strings.Contains(said[0], "starting") {
		t.Errorf("progress %q", said)
	}
}

// A ready service costs one Hello and no wait note.
func TestAwaitSocketReadyOnAReadyService(t *testing.T) {
	sock, hellos := fakeStarting(t, 0)
	waited, _, err := awaitSocketReady(context.Background(), sock, nil)
	if err != nil || waited != 0 || hellos.Load() != 1 {
		t.Fatalf("err %v, waited %v, hellos %d", err, waited, hellos.Load())
	}
}

// A canceled run stops waiting.
func TestAwaitSocketReadyCanceled(t *testing.T) {
	sock, _ := fakeStarting(t, 1<<30)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, _, err := awaitSocketReady(ctx, sock, nil); err == nil {
		t.Fatal("a service that never gets ready: no error")
	}
}
