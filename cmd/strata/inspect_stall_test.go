package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratakv/strata/node/wire"
)

// stalledInspectBody is the body length a stalled reply's header announces.
const stalledInspectBody = 100

// stallingSocket listens on socket and answers Hello like the node service,
// but to a request of type stallOn it sends the header of a reply that
// announces a body and goes silent, with the connection open.
func stallingSocket(t *testing.T, socket string, stallOn wire.Type) {
	t.Helper()
	ln, err := wire.Listen(socket, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					h, _, err := wire.ReadFrame(c)
					if err != nil {
						return
					}
					reply := h.Type.Reply()
					if h.Type == stallOn {
						hdr := append([]byte(wire.Magic), wire.Version, byte(reply))
						hdr = binary.LittleEndian.AppendUint64(hdr, h.ID)
						_, _ = c.Write(binary.LittleEndian.AppendUint32(hdr, stalledInspectBody))
						continue
					}
					var m wire.Message = wire.Error{Code: wire.Internal, Message: "not served"}
					if h.Type == wire.TypeHello {
						m = wire.HelloReply{ClientID: 1, MaxBatch: wire.MaxItems}
					}
					if err := wire.WriteFrame(c, h.ID, m); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// `strata inspect` against a socket whose listener sends the header of its
// reply (to Hello, or to Stats) and stalls returns an error at its --timeout
// that names the stalled frame. Before, the timeout made the read return -1
// bytes and inspect panicked.
func TestInspectFailsOnAStalledReply(t *testing.T) {
	for _, c := range []struct {
		stallOn wire.Type
		step    string
		id      uint64 // fetchStats's request id for it
	}{
		{wire.TypeHello, "hello", 1},
		{wire.TypeStats, "stats", 2},
	} {
		t.Run(c.stallOn.String(), func(t *testing.T) {
			socket := filepath.Join(shortDir(t), "s")
			stallingSocket(t, socket, c.stallOn)
			want := fmt.Sprintf("%s: recv: context deadline exceeded: %s frame (id %d) body: 0 of %d bytes arrived before the receive's deadline",
				c.step, c.stallOn.Reply(), c.id, stalledInspectBody)

			// The command, and the function the other tests poll the service with.
			done := make(chan error, 2)
			go func() {
				var out bytes.Buffer
				done <- runInspect(context.Background(), []string{"--socket", socket, "--timeout", "200ms"}, nil, &out, io.Discard)
			}()
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				defer cancel()
				_, _, err := fetchStats(ctx, socket)
				done <- err
			}()
			for range 2 {
				select {
				case err := <-done:
					if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), want) {
						t.Fatalf("inspect = %v, want an error saying %q", err, want)
					}
				case <-time.After(20 * time.Second):
					t.Fatal("inspect still blocked 20s after the service stalled")
				}
			}
		})
	}
}
