package node

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stratakv/strata/node/wire"
)

// putGetWithin puts 4 KiB under key from c's segment and reads it back, each
// call answered within d: a tenant whose requests keep their latency while
// another holds the request memory.
func putGetWithin(t *testing.T, c *rawClient, key string, d time.Duration) {
	t.Helper()
	r, seg := c.segment(1 << 20)
	mem := r.Bytes()
	for i := range 4096 {
		mem[i] = byte(i*7 + 1)
	}
	for i, call := range []struct {
		typ wire.Type
		msg wire.Message
	}{
		{wire.TypePut, wire.Put{Items: []wire.Item{item(key, seg, 0, 4096)}}},
		{wire.TypeGet, wire.Get{Items: []wire.Item{item(key, seg, 8192, 4096)}}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		begun := time.Now()
		id := uint64(1000 + i)
		err := c.conn.Send(ctx, call.typ, id, call.msg)
		var m wire.Message
		if err == nil {
			_, m, _, err = c.conn.Recv(ctx)
		}
		cancel()
		if err != nil {
			t.Fatalf("%v of the other tenant after %v: %v", call.typ, time.Since(begun), err)
		}
		br, ok := m.(*wire.BatchReply)
		if !ok || br.Results[0].Status != wire.OK {
			t.Fatalf("%v of the other tenant: %+v", call.typ, m)
		}
	}
	if !bytes.Equal(mem[8192:8192+4096], mem[:4096]) {
		t.Fatal("the other tenant read back other bytes")
	}
}

// Finding A: six connections of one user that never said Hello held the whole
// request budget with frame headers declaring large bodies, and another user's
// 4 KiB put and get went from under a millisecond to busy after the request
// timeout. Before Hello a frame is charged nothing: only a small Hello is read.
func TestHeadersBeforeHelloHoldNoRequestMemory(t *testing.T) {
	s := startShared(t, func(c *Config) {
		c.RequestMemoryBytes = 2 * wire.MaxBody
		c.RequestTimeout = 5 * time.Second
		c.HelloTimeout = time.Minute // the silent ones stay for the whole test
	})
	var xs []net.Conn
	for i := range 6 {
		x := rawAs(t, s, 4242, false)
		writeHeader(t, x, wire.TypePut, uint64(i+1), wire.MaxBody) // each declares the largest body
		xs = append(xs, x)
	}
	// Before, the first header took the budget at once; give the service time
	// to read them all.
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) && s.Stats().RequestMemory.UsedBytes == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	if rm := s.Stats().RequestMemory; rm.UsedBytes != 0 {
		t.Fatalf("connections that never said Hello hold %d bytes of request memory", rm.UsedBytes)
	}
	putGetWithin(t, dialAs(t, s, 4243), "other-tenant", 2*time.Second)

	// A Hello longer than a Hello takes is refused and its connection closed,
	// without the service keeping its body.
	big := rawAs(t, s, 4242, false)
	body := make([]byte, 64<<10)
	frame := append([]byte{wire.Magic[0], wire.Magic[1], wire.Version, byte(wire.TypeHello), 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0}, body...)
	big.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := big.Write(frame); err != nil {
		t.Fatal(err)
	}
	h, b, err := wire.ReadFrame(big)
	if err != nil || h.Type != wire.TypeError {
		t.Fatalf("a 64 KiB Hello: %v %v", h.Type, err)
	}
	if m, _ := wire.Decode(h.Type, b); m == nil || !bytes.Contains([]byte(m.(*wire.Error).Message), []byte("at most")) {
		t.Fatalf("a 64 KiB Hello answered %+v", m)
	}
	if _, err := io.Copy(io.Discard, big); err != nil {
		t.Fatalf("the service kept the connection of an oversized Hello: %v", err)
	}
	for _, x := range xs {
		x.Close()
	}
}

// Finding A, after Hello: one user whose frame headers declare large bodies
// it never sends holds the budget until the frame timeout. Another user's
// small requests are served from the reserve meanwhile, within its latency,
// and the user over its share is logged once.
func TestAnotherUserKeepsItsLatencyWhileOneHoldsTheBudget(t *testing.T) {
	logs := &recordingHandler{}
	s := startShared(t, func(c *Config) {
		c.RequestMemoryBytes = 2 * wire.MaxBody
		c.RequestTimeout = 5 * time.Second
		c.FrameTimeout = time.Minute // the stalled headers hold their memory for the whole test
		c.Logger = slog.New(logs)
	})
	const n = 2<<20 - 1<<10 // each header costs 8 MiB: four fill the 32 MiB
	cost := requestCost(wire.Header{Len: n})
	for i := range 6 {
		writeHeader(t, rawAs(t, s, 4242, true), wire.TypePut, uint64(i+1), n)
	}
	waitFor(t, "four headers to hold the budget", func() bool {
		rm := s.Stats().RequestMemory
		return rm.UsedBytes == 4*cost && rm.Users == 1
	})
	putGetWithin(t, dialAs(t, s, 4243), "other-tenant", 2*time.Second)
	waitFor(t, "the other user's put and get to give their memory back", func() bool {
		return s.Stats().RequestMemory.UsedBytes == 4*cost
	})
	rm := s.Stats().RequestMemory
	if rm.FromReserve < 2 {
		t.Fatalf("request memory %+v: want the other user's put and get from the reserve, the stalled user still at 4 x %d", rm, cost)
	}
	if got := logs.count(overShareLine, "uid", 4242); got != 1 {
		t.Fatalf("the user over its share was logged %d times, want once", got)
	}
	if got := logs.count(overShareLine, "uid", 4243); got != 0 {
		t.Fatalf("the user under its share was logged %d times", got)
	}
}

// Finding A: while another user has a request in flight, a user may take no
// more than its share, and each of its requests that waits for that reason is
// counted; the other user's requests go through at once.
func TestAUserIsHeldToItsShareWhileAnotherHasRequestsInFlight(t *testing.T) {
	logs := &recordingHandler{}
	s := startShared(t, func(c *Config) {
		c.RequestMemoryBytes = 2 * wire.MaxBody
		c.RequestTimeout = 10 * time.Second
		c.FrameTimeout = time.Minute
		c.Logger = slog.New(logs)
	})
	// The other user has a request arriving: a header whose body is late.
	writeHeader(t, rawAs(t, s, 4243, true), wire.TypePut, 1, 100)
	yCost := requestCost(wire.Header{Len: 100})
	waitFor(t, "the other user's request to be admitted", func() bool { return s.Stats().RequestMemory.UsedBytes == yCost })
	// Two of these fit in a share of half the budget, 16 MiB; four wait.
	const n = 2<<20 - 2<<10
	xCost := requestCost(wire.Header{Len: n})
	for i := range 6 {
		writeHeader(t, rawAs(t, s, 4242, true), wire.TypePut, uint64(i+1), n)
	}
	waitFor(t, "the user to hold its share and four requests to wait", func() bool {
		rm := s.Stats().RequestMemory
		return rm.UsedBytes == yCost+2*xCost && rm.HeldBack == 4 && rm.Users == 2
	})
	putGetWithin(t, dialAs(t, s, 4243), "other-tenant", 2*time.Second)
	// Their memory comes back just after the replies; the user held to its
	// share gets none of it.
	waitFor(t, "the other user's put and get to give their memory back", func() bool {
		return s.Stats().RequestMemory.UsedBytes == yCost+2*xCost
	})
	if rm := s.Stats().RequestMemory; rm.HeldBack != 4 || rm.FromReserve != 0 {
		t.Fatalf("request memory %+v after the other user's put and get", rm)
	}
	if got := logs.count(overShareLine, "uid", 4242); got != 1 {
		t.Fatalf("the user held to its share was logged %d times, want once", got)
	}
}
