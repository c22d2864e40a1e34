package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node/wire"
)

// waitFor polls cond until it holds, failing the test after a generous deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// hello dials s and introduces itself, returning the error the service answered.
func hello(s *Server, name string) (*wire.Conn, error) {
	conn, err := wire.Dial(context.Background(), s.Socket())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A service that turns the connection away may close it before the Hello
	// is written; its answer is still there to read.
	serr := conn.Send(ctx, wire.TypeHello, 1, wire.Hello{Version: wire.Version, ClientName: name})
	_, m, _, err := conn.Recv(ctx)
	if err != nil && serr != nil {
		err = serr
	}
	if err == nil {
		if e, ok := m.(*wire.Error); ok {
			err = e.Err()
		}
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// Finding 1: running out of descriptors made accept fail once and the accept
// loop return for good; new clients then hung for ever while /healthz said ok.
func TestAcceptSurvivesRunningOutOfDescriptors(t *testing.T) {
	s := start(t, nil)
	old := dial(t, s)

	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	orig := lim
	open, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	lim.Cur = uint64(len(open) + 64)
	if lim.Cur > orig.Cur {
		t.Skipf("descriptor limit %d is already low", orig.Cur)
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	var fillers []int
	release := func() {
		for _, fd := range fillers {
			unix.Close(fd)
		}
		fillers = nil
	}
	t.Cleanup(func() {
		release()
		unix.Setrlimit(unix.RLIMIT_NOFILE, &orig)
	})
	for {
		fd, err := unix.Dup(2)
		if errors.Is(err, unix.EMFILE) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		fillers = append(fillers, fd)
	}
	// One descriptor for the new client's socket: the service's accept of it
	// finds none left.
	unix.Close(fillers[len(fillers)-1])
	fillers = fillers[:len(fillers)-1]
	conn, err := wire.Dial(context.Background(), s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitFor(t, "the service to notice it cannot accept", func() bool { return s.health() != nil })
	if st := s.Stats(); st.Accepting || !strings.Contains(st.AcceptError, "too many open files") {
		t.Fatalf("stats while accept fails: accepting %v, %q", st.Accepting, st.AcceptError)
	}
	// Clients already connected go on.
	if _, err := old.call(wire.TypePing, wire.Ping{Nonce: 3}); err != nil {
		t.Fatalf("connected client while accept fails: %v", err)
	}
	release()
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	// The pending client is accepted once descriptors are free again.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := conn.Send(ctx, wire.TypeHello, 1, wire.Hello{Version: wire.Version, ClientName: "late"}); err != nil {
		t.Fatal(err)
	}
	if _, m, _, err := conn.Recv(ctx); err != nil {
		t.Fatalf("a client that connected while descriptors ran out was never served: %v", err)
	} else if _, ok := m.(*wire.HelloReply); !ok {
		t.Fatalf("hello answered %T %+v", m, m)
	}
	waitFor(t, "health to come back", func() bool { return s.health() == nil })
	resp, err := http.Get("http://" + s.AdminAddr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("healthz after recovery: %d", resp.StatusCode)
	}
	if st := s.Stats(); st.Ops.AcceptErrors == 0 {
		t.Fatal("accept errors not counted")
	}
}

// /healthz answers 503 while the socket cannot accept.
func TestHealthzReportsFailingAccept(t *testing.T) {
	s := start(t, nil)
	s.acceptErr.Store(&acceptFailure{err: unix.EMFILE, at: time.Now()})
	resp, herr := http.Get("http://" + s.AdminAddr() + "/healthz")
	if herr != nil {
		t.Fatal(herr)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "cannot accept") {
		t.Fatalf("healthz while accept fails: %d %q", resp.StatusCode, b)
	}
}

// Finding 1: the quota counted bytes, so thousands of tiny segments could
// exhaust the service's descriptors.
func TestSegmentsPerClientAreCapped(t *testing.T) {
	s := start(t, func(c *Config) { c.MaxSegmentsPerClient = 3 })
	c := dial(t, s)
	for range 3 {
		c.segment(4096)
	}
	a, _ := hostmem.New(hostmem.Config{Kind: hostmem.Shm})
	r, err := a.Allocate("test", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, err = c.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: uint64(r.Size()), Name: "kv"}, r.Fd())
	if wire.StatusOf(err) != wire.Quota || !strings.Contains(err.Error(), "--max-segments-per-client") {
		t.Fatalf("fourth segment: %v", err)
	}
	if st := s.Stats(); st.SegmentCount != 3 {
		t.Fatalf("segments %d, want 3", st.SegmentCount)
	}
}

// Finding 3: connections that never said Hello, or sent part of a frame, held
// their slots for ever, and every new client got busy.
func TestSilentAndStalledConnectionsLoseTheirSlots(t *testing.T) {
	s := start(t, func(c *Config) {
		c.MaxClients = 4
		c.HelloTimeout = time.Second // long enough for the stalled client's Hello on a busy machine
		c.FrameTimeout = 50 * time.Millisecond
	})
	var raws []net.Conn
	defer func() {
		for _, c := range raws {
			c.Close()
		}
	}()
	rawDial := func() net.Conn {
		c, err := net.Dial("unix", s.Socket())
		if err != nil {
			t.Fatal(err)
		}
		raws = append(raws, c)
		return c
	}
	rawDial()                     // says nothing
	rawDial().Write([]byte("ST")) // two bytes of a header, before Hello
	stalled := rawDial()          // Hello, then part of a frame
	if err := wire.WriteFrame(stalled, 1, wire.Hello{Version: wire.Version, ClientName: "stall"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := wire.ReadFrame(stalled); err != nil {
		t.Fatal(err)
	}
	if _, err := stalled.Write([]byte("ST")); err != nil {
		t.Fatal(err)
	}
	rawDial() // says nothing
	// Each of them is disconnected: the service closes its end.
	for i, c := range raws {
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Fatalf("connection %d was not closed by the service: %v", i, err)
		}
	}
	// A client that keeps sending other frames instead of Hello gets no more
	// time than one that sends nothing.
	waitFor(t, "the slots to free", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.sessions) == 0
	})
	chatty := rawDial()
	chatty.SetDeadline(time.Now().Add(20 * time.Second))
	for i := uint64(1); ; i++ {
		if err := wire.WriteFrame(chatty, i, wire.Ping{Nonce: i}); err != nil {
			break
		}
		if _, _, err := wire.ReadFrame(chatty); err != nil {
			if os.IsTimeout(err) {
				t.Fatal("a client that never said Hello kept its connection")
			}
			break
		}
	}
	waitFor(t, "the chatty client to time out", func() bool { return s.Stats().Ops.TimedOut == 5 })
	conn, err := hello(s, "newcomer")
	if err != nil {
		t.Fatalf("a new client after the silent ones timed out: %v", err)
	}
	conn.Close()
}

// Finding 3: with an idle timeout, a client that sends nothing is disconnected,
// but not while it waits for a request of its own.
func TestIdleTimeoutSparesClientsWithRequestsInFlight(t *testing.T) {
	gate := make(chan struct{})
	var entered atomic.Int32
	s := start(t, func(c *Config) {
		c.IdleTimeout = time.Second // long enough for the busy client to send its Get on a busy machine
		c.hooks = &hooks{admitted: func(wire.Type) {
			entered.Add(1)
			<-gate
		}}
	})
	busy := dial(t, s)
	_, seg := busy.segment(1 << 20)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := busy.conn.Send(ctx, wire.TypeGet, 100, wire.Get{Items: []wire.Item{item("k", seg, 0, 4096)}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the get to be admitted", func() bool { return entered.Load() == 1 })
	idle := dial(t, s)
	if _, _, _, err := idle.conn.Recv(ctx); !errors.Is(err, io.EOF) {
		t.Fatalf("idle client: %v, want the service to close it", err)
	}
	close(gate)
	h, m, _, err := busy.conn.Recv(ctx)
	if err != nil || h.ID != 100 {
		t.Fatalf("busy client's get: %v %+v", err, m)
	}
	if st := s.Stats(); st.Ops.TimedOut < 1 {
		t.Fatalf("timed out %d", st.Ops.TimedOut)
	}
}

// Finding 3: one user's connections cannot take every slot.
func TestConnectionsPerUserAreCapped(t *testing.T) {
	s := start(t, func(c *Config) { c.MaxClients, c.MaxClientsPerUID = 8, 2 })
	a, b := dial(t, s), dial(t, s)
	_, err := hello(s, "third")
	if wire.StatusOf(err) != wire.Busy || !strings.Contains(err.Error(), "--max-clients-per-uid") {
		t.Fatalf("third connection of one user: %v", err)
	}
	a.conn.Close()
	waitFor(t, "the slot to free", func() bool { return len(s.Stats().Clients) == 1 })
	conn, err := hello(s, "fourth")
	if err != nil {
		t.Fatalf("after one closed: %v", err)
	}
	conn.Close()
	_ = b
	if st := s.Stats(); st.Ops.Rejected != 1 {
		t.Fatalf("rejected %d", st.Ops.Rejected)
	}
}

// countingHandler counts log records by message.
type countingHandler struct {
	mu     sync.Mutex
	counts map[string]int
	attrs  map[string][]slog.Attr
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[r.Message]++
	r.Attrs(func(a slog.Attr) bool {
		h.attrs[r.Message] = append(h.attrs[r.Message], a)
		return true
	})
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

// Finding 4: every refused registration grew the session's list and wrote a
// log line, without bound.
func TestRefusalsAreBoundedAndTheirLogsRateLimited(t *testing.T) {
	logs := &countingHandler{counts: map[string]int{}, attrs: map[string][]slog.Attr{}}
	s := start(t, func(c *Config) {
		c.ClientQuotaBytes = 1 << 20
		c.Logger = slog.New(logs)
	})
	c := dial(t, s)
	a, _ := hostmem.New(hostmem.Config{Kind: hostmem.Shm})
	r, err := a.Allocate("test", 2<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	const n = 300
	for range n {
		_, err := c.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: uint64(r.Size()), Name: "big"}, r.Fd())
		if wire.StatusOf(err) != wire.Quota {
			t.Fatalf("over quota: %v", err)
		}
	}
	st := s.Stats()
	cs := st.Clients[0]
	if len(cs.Refused) != maxRefused || cs.RefusedOmitted != n-maxRefused || st.Ops.Refused != n {
		t.Fatalf("refused kept %d, omitted %d, counted %d; want %d, %d, %d", len(cs.Refused), cs.RefusedOmitted, st.Ops.Refused, maxRefused, n-maxRefused, n)
	}
	logs.mu.Lock()
	lines := logs.counts["segment registration refused"]
	logs.mu.Unlock()
	// Ten lines a minute; a very slow run may span a few minutes.
	if lines < 1 || lines > 40 {
		t.Fatalf("%d log lines for %d refusals", lines, n)
	}
}

// The log limiter reports what it suppressed on the next line it lets through.
func TestLogLimiterCountsSuppressedLines(t *testing.T) {
	logs := &countingHandler{counts: map[string]int{}, attrs: map[string][]slog.Attr{}}
	l := newLogLimiter(slog.New(logs), time.Hour, 3)
	for range 10 {
		l.warn("a")
	}
	l.warn("b")
	if logs.counts["a"] != 3 || logs.counts["b"] != 1 {
		t.Fatalf("counts %v", logs.counts)
	}
	// A new window: the next line says how many were dropped.
	l.kinds["a"].start = time.Now().Add(-2 * time.Hour)
	l.warn("a")
	var suppressed int64
	for _, at := range logs.attrs["a"] {
		if at.Key == "suppressed" {
			suppressed = at.Value.Int64()
		}
	}
	if suppressed != 7 {
		t.Fatalf("suppressed %d, want 7", suppressed)
	}
}

// Finding 4: a Stats document over the frame limit got no reply at all. It is
// abridged to fit, whatever the clients registered.
func TestStatsDocumentStaysUnderTheFrameLimit(t *testing.T) {
	const limit = 4096
	s := start(t, func(c *Config) { c.hooks = &hooks{statsLimit: limit} })
	var cs []*rawClient
	for i := range 6 {
		c := dial(t, s)
		for j := range 3 {
			name := fmt.Sprintf("%d-%d-%s", i, j, strings.Repeat("n", 200))
			a, _ := hostmem.New(hostmem.Config{Kind: hostmem.Shm})
			r, err := a.Allocate("test", 4096)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() })
			if _, err := c.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: 4096, Name: name}, r.Fd()); err != nil {
				t.Fatal(err)
			}
		}
		cs = append(cs, c)
	}
	if full, _ := json.Marshal(s.Stats()); len(full) <= limit {
		t.Fatalf("the full document is only %d bytes; the test needs more", len(full))
	}
	m, err := cs[0].call(wire.TypeStats, nil)
	if err != nil {
		t.Fatal(err)
	}
	doc := m.(*wire.StatsReply).JSON
	var st Stats
	if err := json.Unmarshal(doc, &st); err != nil {
		t.Fatalf("%v: %s", err, doc)
	}
	if len(doc) > limit || !st.Abridged || st.ClientCount != 6 || st.SegmentCount != 18 || len(st.Clients)+st.ClientsOmitted != 6 {
		t.Fatalf("%d bytes (limit %d), abridged %v, clients %d+%d of %d, segments %d", len(doc), limit, st.Abridged, len(st.Clients), st.ClientsOmitted, st.ClientCount, st.SegmentCount)
	}
}

// Finding 5: requests in flight held memory without a node-wide bound. Beyond
// the budget a request waits, then is answered busy; the budget comes back.
func TestRequestMemoryBudget(t *testing.T) {
	gate := make(chan struct{})
	var entered atomic.Int32
	s := start(t, func(c *Config) {
		c.RequestMemoryBytes = wire.MaxBody
		c.RequestTimeout = 100 * time.Millisecond
		c.hooks = &hooks{admitted: func(wire.Type) {
			entered.Add(1)
			<-gate
		}}
	})
	c := dial(t, s)
	_, seg := c.segment(1 << 20)
	// A Get of about 1.3 MiB on the wire: each costs about 5 MiB of the 16.
	items := make([]wire.Item, wire.MaxItems)
	for i := range items {
		items[i] = item(fmt.Sprintf("%0300d", i), seg, uint64(i)*256, 256) // its own bytes: a Get's items must not overlap
	}
	frame, err := wire.AppendFrame(nil, 1, wire.Get{Items: items})
	if err != nil {
		t.Fatal(err)
	}
	cost := requestCost(wire.Header{Len: uint32(len(frame) - wire.HeaderSize)})
	fit := int(wire.MaxBody / cost)
	if fit < 1 || fit >= maxInflight-1 {
		t.Fatalf("a request costs %d bytes: %d fit, the test needs 1 to %d", cost, fit, maxInflight-2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for id := 1; id <= fit+1; id++ {
		if err := c.conn.Send(ctx, wire.TypeGet, uint64(id), wire.Get{Items: items}); err != nil {
			t.Fatal(err)
		}
	}
	// The one beyond the budget is answered busy while the others are held.
	h, m, _, err := c.conn.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := m.(*wire.Error); !ok || e.Code != wire.Busy || h.ID != uint64(fit+1) || int(entered.Load()) != fit {
		t.Fatalf("reply to %d: %+v; %d admitted, %d fit", h.ID, m, entered.Load(), fit)
	}
	if st := s.Stats(); st.RequestMemory.UsedBytes != int64(fit)*cost || st.Ops.MemoryBusy != 1 {
		t.Fatalf("request memory %+v, busy %d", st.RequestMemory, st.Ops.MemoryBusy)
	}
	close(gate)
	for range fit {
		if _, _, _, err := c.conn.Recv(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The burst filled more than half the budget: once it drained, the heap
	// was handed back to the OS.
	waitFor(t, "the budget to drain", func() bool {
		rm := s.Stats().RequestMemory
		return rm.UsedBytes == 0 && rm.Freed == 1
	})
}

// Finding 10: the admin port answered any Host (DNS rebinding from a browser)
// and served every client's details to any local user.
func TestAdminChecksHostAndStatsModes(t *testing.T) {
	get := func(s *Server, host, path string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+s.AdminAddr()+path, nil)
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	s := start(t, nil)
	_, port, _ := net.SplitHostPort(s.AdminAddr())
	for _, host := range []string{"evil.example", "evil.example:" + port, "10.0.0.1:" + port} {
		if code, _ := get(s, host, "/stats"); code != http.StatusMisdirectedRequest {
			t.Fatalf("Host %q: %d", host, code)
		}
	}
	for _, host := range []string{"", "localhost:" + port, "LOCALHOST", "127.0.0.1:" + port, "[::1]:" + port} {
		if code, _ := get(s, host, "/healthz"); code != 200 {
			t.Fatalf("Host %q: %d", host, code)
		}
	}

	counts := start(t, func(c *Config) { c.AdminStats = AdminStatsCounts })
	cl := dial(t, counts)
	cl.segment(4096)
	code, body := get(counts, "", "/stats")
	var st Stats
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil || st.ClientCount != 1 || st.SegmentCount != 1 || st.Clients != nil || strings.Contains(body, t.Name()) {
		t.Fatalf("counts: %d %v %s", code, err, body)
	}
	off := start(t, func(c *Config) { c.AdminStats = AdminStatsOff })
	if code, _ := get(off, "", "/stats"); code != http.StatusNotFound {
		t.Fatalf("stats off: %d", code)
	}
	if code, _ := get(off, "", "/metrics"); code != 200 {
		t.Fatalf("metrics with stats off: %d", code)
	}
}
