package wire

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// stallTimeout is the frame timeout (server side) or receive deadline (client
// side) of the stalled-peer tests: short, since every case waits it out.
const stallTimeout = 30 * time.Millisecond

// stallBound bounds every wait of these tests, so that a reader that hangs
// fails the test instead of hanging it: generous, for a busy machine.
const stallBound = 10 * time.Second

// stallFrame is a frame of m's type whose body is at least two bytes, so that
// a part of it can be sent: a message that marshals shorter (Ack, Stats) is
// padded. The padded frame does not decode; no test lets it arrive whole.
func stallFrame(t testing.TB, id uint64, m Message) (frame []byte, bodyLen int) {
	t.Helper()
	body := m.Marshal(nil)
	if len(body) < 2 {
		body = append(body, make([]byte, 100)...)
	}
	return append(rawHeader(Magic, Version, byte(m.Type()), id, uint32(len(body))), body...), len(body)
}

// stall is what a stalled peer sends of a frame before it goes silent, and
// the count the receiver's error must name ("got of want bytes").
type stall struct {
	name      string
	sent      int
	got, want int
}

func stalls(bodyLen int) []stall {
	return []stall{
		{"header only", HeaderSize, 0, bodyLen},
		{"part of the body", HeaderSize + bodyLen/2, bodyLen / 2, bodyLen},
		{"part of the header", 10, 10, HeaderSize},
	}
}

// recvWithin runs recv and fails the test if it does not return within stallBound.
func recvWithin(t *testing.T, recv func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- recv() }()
	select {
	case err := <-done:
		return err
	case <-time.After(stallBound):
		t.Fatalf("Recv still blocked %v after the peer stalled", stallBound)
		return nil
	}
}

// A peer that sends part of a frame of any type and goes silent fails the
// receiver's Recv with an error that names the frame and what arrived, on a
// server's reader (a gate and a frame timeout, no deadline) and a client's (a
// deadline, no frame timeout) alike, and the connection is unusable after it.
// Before, the deadline made ReadMsgUnix return -1 bytes and readBody panicked
// with "slice bounds out of range [:-1]".
func TestStalledPeerEveryFrameType(t *testing.T) {
	for _, m := range samples() {
		t.Run(m.Type().String(), func(t *testing.T) {
			t.Parallel()
			fr, bodyLen := stallFrame(t, 7, m)
			for _, side := range []string{"server", "client"} {
				for _, s := range stalls(bodyLen) {
					t.Run(side+"/"+s.name, func(t *testing.T) {
						a, b := socketpair(t)
						ctx := context.Background()
						bound := fmt.Sprintf("before the %v frame timeout", stallTimeout)
						if side == "server" {
							b.SetFrameTimeout(stallTimeout)
							b.SetGate(func(context.Context, Header) error { return nil })
						} else {
							var cancel context.CancelFunc
							ctx, cancel = context.WithTimeout(ctx, stallTimeout)
							defer cancel()
							bound = "before the receive's deadline"
						}
						if _, err := a.uc.Write(fr[:s.sent]); err != nil {
							t.Fatal(err)
						}
						err := recvWithin(t, func() error { _, _, _, err := b.Recv(ctx); return err })
						if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, os.ErrDeadlineExceeded) {
							t.Fatalf("Recv = %v, want a deadline error", err)
						}
						what := "frame header"
						if s.sent >= HeaderSize {
							what = fmt.Sprintf("%s frame (id 7) body", m.Type())
						}
						if want := fmt.Sprintf("%s: %d of %d bytes arrived %s", what, s.got, s.want, bound); !strings.Contains(err.Error(), want) {
							t.Fatalf("Recv error %q does not say %q", err, want)
						}
						if _, _, _, err := b.Recv(context.Background()); !errors.Is(err, ErrClosed) {
							t.Fatalf("Recv after the stalled frame: %v, want ErrClosed", err)
						}
					})
				}
			}
		})
	}
}

// Closing a connection whose reader waits for the rest of a frame ends the
// Recv with ErrClosed. A close makes ReadMsgUnix return -1 bytes too.
func TestCloseDuringStalledBody(t *testing.T) {
	a, b := socketpair(t)
	fr, _ := stallFrame(t, 3, &StatsReply{JSON: []byte(`{"objects":1}`)})
	if _, err := a.uc.Write(fr[:HeaderSize+1]); err != nil {
		t.Fatal(err)
	}
	err := recvWithin(t, func() error {
		time.AfterFunc(stallTimeout, func() { b.Close() })
		_, _, _, err := b.Recv(context.Background())
		return err
	})
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("Recv = %v, want ErrClosed", err)
	}
}

// A frame the gate refuses is read and dropped; a peer that stalls in its
// body fails the Recv like any other stalled frame.
func TestStalledBodyOfARefusedFrame(t *testing.T) {
	a, b := socketpair(t)
	b.SetFrameTimeout(stallTimeout)
	refused := errors.New("no memory for it")
	b.SetGate(func(context.Context, Header) error { return refused })
	fr, bodyLen := stallFrame(t, 5, &Put{Items: putItems(2, 2, 2)})
	if _, err := a.uc.Write(fr[:HeaderSize+3]); err != nil {
		t.Fatal(err)
	}
	err := recvWithin(t, func() error { _, _, _, err := b.Recv(context.Background()); return err })
	var me *MessageError
	if errors.As(err, &me) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Recv = %v, want a deadline error, not the gate's", err)
	}
	if want := fmt.Sprintf("Put frame (id 5) body, refused: 3 of %d bytes arrived before the %v frame timeout", bodyLen, stallTimeout); !strings.Contains(err.Error(), want) {
		t.Fatalf("Recv error %q does not say %q", err, want)
	}
	// Whole, a refused frame leaves the connection in sync.
	a2, b2 := socketpair(t)
	b2.SetFrameTimeout(stallTimeout)
	b2.SetGate(func(context.Context, Header) error { return refused })
	ctx, cancel := context.WithTimeout(context.Background(), stallBound)
	defer cancel()
	if err := a2.Send(ctx, TypePut, 6, &Put{Items: putItems(2, 2, 2)}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := b2.Recv(ctx); !errors.As(err, &me) || !errors.Is(err, refused) || me.Header.ID != 6 {
		t.Fatalf("Recv of a whole refused frame = %v", err)
	}
}
