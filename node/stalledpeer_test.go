package node

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stratakv/strata/node/wire"
)

// stalledBound bounds every wait of the stalled-peer tests, so that a service
// that hangs fails them rather than hanging them.
const stalledBound = 20 * time.Second

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// stalledPeer is a raw connection that sends part of a frame and goes silent.
type stalledPeer struct {
	name  string
	hello bool     // say Hello (whole) first
	sends [][]byte // written in turn, a short pause between them
	want  string   // in the service's log line for the connection it closed
}

// stallFrames are a Put frame with a body of some size, and a Hello frame.
func stallFrames(t *testing.T) (put, hello []byte) {
	t.Helper()
	put, err := wire.AppendFrame(nil, 2, wire.Put{Items: []wire.Item{item("stalled-object", 1, 0, 4096)}})
	if err != nil {
		t.Fatal(err)
	}
	hello, err = wire.AppendFrame(nil, 1, wire.Hello{Version: wire.Version, ClientName: "stalled"})
	if err != nil {
		t.Fatal(err)
	}
	return put, hello
}

// run dials s and sends what p sends, then stays silent.
func (p stalledPeer) run(t *testing.T, s *Server, hello []byte) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.SetDeadline(time.Now().Add(stalledBound)); err != nil {
		t.Fatal(err)
	}
	if p.hello {
		if _, err := c.Write(hello); err != nil {
			t.Fatal(err)
		}
		if h, _, err := wire.ReadFrame(c); err != nil || h.Type != wire.TypeHelloReply {
			t.Fatalf("%s: Hello answered %+v, %v", p.name, h, err)
		}
	}
	for i, b := range p.sends {
		if i > 0 {
			time.Sleep(5 * time.Millisecond)
		}
		if _, err := c.Write(b); err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
	}
	return c
}

// closedByService waits until the service closes c, failing the test if it
// has not within stalledBound.
func closedByService(t *testing.T, what string, c net.Conn) {
	t.Helper()
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("%s: the service did not close the stalled connection: %v", what, err)
	}
}

// Any process that can connect to the socket sends part of a frame (a header
// that announces a body, part of a body, a header in two writes, a Hello's
// header) and goes silent. The service closes that connection when the frame
// or Hello timeout ends, says so in its log, and serves everyone else. Before,
// the timeout made the read return -1 bytes and the service panicked in
// readBody ("slice bounds out of range [:-1]") and exited.
func TestStalledPeersAreDisconnectedAndTheServiceServesOn(t *testing.T) {
	const frameTimeout = 100 * time.Millisecond
	logs := &lockedBuffer{}
	s := start(t, func(c *Config) {
		c.FrameTimeout = frameTimeout
		c.HelloTimeout = stalledBound // long enough for the Hellos on a busy machine
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	before := dial(t, s) // a client that was there all along
	put, hello := stallFrames(t)
	body := len(put) - wire.HeaderSize
	bound := fmt.Sprintf("arrived before the %v frame timeout", frameTimeout)
	peers := []stalledPeer{
		{"header announcing a body", true, [][]byte{put[:wire.HeaderSize]},
			fmt.Sprintf("Put frame (id 2) body: 0 of %d bytes %s", body, bound)},
		{"part of a body", true, [][]byte{put[:wire.HeaderSize+body/2]},
			fmt.Sprintf("Put frame (id 2) body: %d of %d bytes %s", body/2, body, bound)},
		// The frame timeout runs from the header's first byte, so on a machine
		// slow enough to pause past it between the writes, the service gives
		// up on the header instead: the line names the frame timeout either way.
		{"header split across two writes", true, [][]byte{put[:7], put[7:wire.HeaderSize]}, bound},
		{"Hello header before Hello", false, [][]byte{hello[:wire.HeaderSize]},
			fmt.Sprintf("Hello frame (id 1) body: 0 of %d bytes %s", len(hello)-wire.HeaderSize, bound)},
	}
	conns := make([]net.Conn, len(peers))
	for i, p := range peers {
		conns[i] = p.run(t, s, hello)
	}
	for i, p := range peers {
		closedByService(t, p.name, conns[i])
		if logs.count(p.want) == 0 {
			t.Errorf("%s: no log line says %q; the log:\n%s", p.name, p.want, logs.String())
		}
	}
	waitFor(t, "the stalled connections to be counted", func() bool { return s.Stats().Ops.TimedOut == int64(len(peers)) })
	if n := logs.count("client disconnected: no Hello, an unfinished frame or idle past its timeout"); n != len(peers) {
		t.Errorf("%d disconnections logged, want %d", n, len(peers))
	}
	// The service serves on: the client that was there, and a new one.
	if m, err := before.call(wire.TypePing, wire.Ping{Nonce: 7}); err != nil || m.(*wire.Pong).Nonce != 7 {
		t.Fatalf("ping from the client that was connected all along: %v %v", m, err)
	}
	after := dial(t, s)
	if _, err := after.call(wire.TypeStats, wire.Stats{}); err != nil {
		t.Fatalf("stats from a new client: %v", err)
	}
}

// A peer that sends a Hello's header and stalls, with a Hello timeout shorter
// than the frame timeout, is disconnected when the Hello timeout ends, and the
// service serves on.
func TestStalledHelloIsDisconnectedAtTheHelloTimeout(t *testing.T) {
	const helloTimeout = 500 * time.Millisecond // the clients that do say Hello must on a busy machine
	logs := &lockedBuffer{}
	s := start(t, func(c *Config) {
		c.HelloTimeout = helloTimeout
		c.FrameTimeout = stalledBound
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	before := dial(t, s)
	_, helloFrame := stallFrames(t)
	p := stalledPeer{name: "Hello header", sends: [][]byte{helloFrame[:wire.HeaderSize]}}
	began := time.Now()
	closedByService(t, p.name, p.run(t, s, helloFrame))
	if d := time.Since(began); d >= stalledBound {
		t.Fatalf("closed after %v: by the frame timeout, not the Hello timeout", d)
	}
	want := fmt.Sprintf("Hello frame (id 1) body: 0 of %d bytes arrived before the receive's deadline", len(helloFrame)-wire.HeaderSize)
	waitFor(t, "the disconnection to be logged", func() bool { return logs.count(want) == 1 })
	if m, err := before.call(wire.TypePing, wire.Ping{Nonce: 3}); err != nil || m.(*wire.Pong).Nonce != 3 {
		t.Fatalf("ping from the client that was connected all along: %v %v", m, err)
	}
	if c, err := hello(s, "newcomer"); err != nil {
		t.Fatalf("a new client after the stalled Hello: %v", err)
	} else {
		c.Close()
	}
	if st := s.Stats(); st.Ops.TimedOut != 1 || !strings.Contains(logs.String(), "--hello-timeout") {
		t.Fatalf("timed out %d; log:\n%s", st.Ops.TimedOut, logs.String())
	}
}
