package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/storage/redisstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

func socketPath(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "s")
}

func start(t testing.TB, tweak func(*Config)) *Server {
	t.Helper()
	cfg := DefaultConfig(socketPath(t))
	cfg.ArenaBytes = 16 << 20
	cfg.Logger = quiet
	acfg := hostmem.DefaultConfig(hostmem.Mmap)
	acfg.ReserveBytes = 0
	acfg.Logger = quiet
	cfg.Allocator, _ = hostmem.New(acfg)
	cfg.OpenRemote = openTestRedis
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// openTestRedis is the service's remote store in tests: Redis, as strata serve
// wires it (node/redisremote, which this package's tests cannot import).
func openTestRedis(ctx context.Context, cfg RemoteConfig) (RemoteStore, error) {
	rc := redisstore.DefaultConfig(cfg.Addrs...)
	rc.Username, rc.Password, rc.TLS, rc.Logger = cfg.Username, cfg.Password, cfg.TLS, cfg.Logger
	st, err := redisstore.New(ctx, rc)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// rawClient speaks the protocol by hand.
type rawClient struct {
	t    testing.TB
	conn *wire.Conn
	id   uint64
}

func dial(t testing.TB, s *Server) *rawClient {
	t.Helper()
	conn, err := wire.Dial(context.Background(), s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	c := &rawClient{t: t, conn: conn}
	t.Cleanup(func() { conn.Close() })
	if _, err := c.call(wire.TypeHello, wire.Hello{Version: wire.Version, ClientName: t.Name()}); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *rawClient) call(t wire.Type, msg wire.Message, fds ...int) (wire.Message, error) {
	c.t.Helper()
	c.id++
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.conn.Send(ctx, t, c.id, msg, fds...); err != nil {
		return nil, err
	}
	h, m, _, err := c.conn.Recv(ctx)
	if err != nil {
		return nil, err
	}
	if h.ID != c.id {
		c.t.Fatalf("reply to %d, want %d", h.ID, c.id)
	}
	if e, ok := m.(*wire.Error); ok {
		return nil, e.Err()
	}
	return m, nil
}

// segment allocates a sealed memfd region and registers it.
func (c *rawClient) segment(size int64) (*hostmem.Region, uint32) {
	c.t.Helper()
	a, _ := hostmem.New(hostmem.Config{Kind: hostmem.Shm})
	r, err := a.Allocate("test", size)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { r.Close() })
	m, err := c.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: uint64(r.Size()), Name: "kv"}, r.Fd())
	if err != nil {
		c.t.Fatal(err)
	}
	return r, m.(*wire.RegisterSegmentReply).SegmentID
}

func item(key string, seg uint32, off, n uint64) wire.Item {
	return wire.Item{Key: key, Format: 7, Ranges: []wire.Range{{Segment: seg, Offset: off, Length: n}}}
}

func (c *rawClient) batch(t wire.Type, items ...wire.Item) []wire.Result {
	c.t.Helper()
	var msg wire.Message = wire.Put{Items: items}
	if t == wire.TypeGet {
		msg = wire.Get{Items: items}
	}
	m, err := c.call(t, msg)
	if err != nil {
		c.t.Fatal(err)
	}
	return m.(*wire.BatchReply).Results
}

func TestPutGetRoundTripAndWriteOnce(t *testing.T) {
	s := start(t, nil)
	c := dial(t, s)
	r, seg := c.segment(1 << 20)
	mem := r.Bytes()
	for i := range mem[:8192] {
		mem[i] = byte(i * 3)
	}
	if res := c.batch(wire.TypePut, item("a", seg, 0, 4096), item("b", seg, 4096, 4096)); res[0].Status != wire.OK || res[1].Status != wire.OK {
		t.Fatalf("put: %+v", res)
	}
	mem[0] = 99 // a second put of a must not move data
	c.batch(wire.TypePut, item("a", seg, 0, 4096))
	res := c.batch(wire.TypeGet, item("a", seg, 65536, 4096), item("missing", seg, 0, 16), item("b", seg, 70000, 4096))
	if res[0].Status != wire.OK || res[1].Status != wire.NotFound || res[2].Status != wire.OK {
		t.Fatalf("get: %+v", res)
	}
	if mem[65536] != 0 || !bytes.Equal(mem[65537:65536+4096], func() []byte {
		b := make([]byte, 4095)
		for i := range b {
			b[i] = byte((i + 1) * 3)
		}
		return b
	}()) {
		t.Fatal("object bytes differ, or the second put overwrote the first")
	}
	m, err := c.call(wire.TypeExists, wire.Exists{Keys: []string{"a", "b", "missing", "a"}, Format: 7})
	if err != nil || m.(*wire.ExistsReply).Present != 2 {
		t.Fatalf("exists: %+v %v", m, err)
	}
	m, err = c.call(wire.TypeExists, wire.Exists{Keys: []string{"a"}, Format: 8})
	if err != nil || m.(*wire.ExistsReply).Present != 0 {
		t.Fatalf("exists in another format: %+v %v", m, err)
	}
	m, err = c.call(wire.TypeRemove, wire.Remove{Keys: []string{"a", "zzz"}})
	if err != nil || m.(*wire.RemoveReply).Removed != 1 {
		t.Fatalf("remove: %+v %v", m, err)
	}
}

// A client can name only its own segments, and only inside them.
func TestRangesOutsideTheClientsSegmentsAreRefused(t *testing.T) {
	s := start(t, nil)
	a, b := dial(t, s), dial(t, s)
	_, segA := a.segment(1 << 20)
	_, segB := b.segment(64 << 10)
	cases := []wire.Item{
		item("x", segA, 0, 16),         // a's segment id, used by b
		item("x", segB, 64<<10, 1),     // one past the end
		item("x", segB, 60<<10, 8<<10), // crosses the end
		item("x", 99, 0, 16),           // no such segment
		item("x", segB, 1<<62, 1<<62),  // absurd offset
	}
	if segA == segB {
		cases = cases[1:] // ids are per client: b's own id may equal a's
	}
	for _, it := range cases {
		for _, op := range []wire.Type{wire.TypePut, wire.TypeGet} {
			res := b.batch(op, it)
			if res[0].Status != wire.BadRange || !strings.Contains(res[0].Message, "shm allocator") || !strings.Contains(res[0].Message, "registered") {
				t.Fatalf("%v of %+v: %+v", op, it.Ranges, res[0])
			}
		}
	}
	// A range overflowing uint64 ("a negative length") never reaches the service's
	// copy: the request is malformed, answered, and the connection goes on.
	bad := wire.Put{Items: []wire.Item{{Key: "x", Format: 7, Ranges: []wire.Range{{Segment: segB, Offset: 10, Length: ^uint64(0)}}}}}
	raw, err := wire.AppendFrame(nil, 77, bad)
	if err == nil {
		t.Fatalf("an overflowing range was encoded: %d bytes", len(raw))
	}
	if st := s.Stats(); st.Ops.BadRanges == 0 || len(st.Clients) != 2 {
		t.Fatalf("stats %+v", st.Ops)
	}
	// The service still serves both.
	if _, err := a.call(wire.TypePing, wire.Ping{Nonce: 1}); err != nil {
		t.Fatal(err)
	}
}

// Descriptors that are not shared memory are refused; unsealed memfds are
// accepted (fault_test.go covers what happens when they shrink).
func TestSegmentsThatAreNotMemfdsAreRefused(t *testing.T) {
	s := start(t, nil)
	c := dial(t, s)
	f, err := os.CreateTemp(t.TempDir(), "notmemfd")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(1 << 20); err != nil {
		t.Fatal(err)
	}
	_, err = c.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: 1 << 20, Name: "kv"}, int(f.Fd()))
	if wire.StatusOf(err) != wire.BadRange || !strings.Contains(err.Error(), "not a memfd") {
		t.Fatalf("regular file: %v", err)
	}
	fd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	_ = unix.Ftruncate(fd, 1<<20)
	if _, err := c.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: 1 << 20, Name: "kv"}, fd); err != nil {
		t.Fatalf("unsealed memfd refused: %v", err)
	}
	a, _ := hostmem.New(hostmem.Config{Kind: hostmem.Shm})
	r, _ := a.Allocate("x", 1<<20)
	defer r.Close()
	if _, err := c.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: 4 << 20, Name: "kv"}, r.Fd()); err == nil {
		t.Fatal("a memfd registered with the wrong size")
	}
	if st := s.Stats(); st.Ops.Refused != 2 || len(st.Clients[0].Refused) != 2 {
		t.Fatalf("refusals %+v", st.Clients)
	}
}

func TestQuotaRefusesRegistrationCleanly(t *testing.T) {
	s := start(t, func(c *Config) { c.ClientQuotaBytes = 3 << 20 })
	c := dial(t, s)
	c.segment(2 << 20)
	a, _ := hostmem.New(hostmem.Config{Kind: hostmem.Shm})
	r, _ := a.Allocate("draft", 2<<20)
	defer r.Close()
	_, err := c.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: uint64(r.Size()), Name: "draft"}, r.Fd())
	if wire.StatusOf(err) != wire.Quota || !strings.Contains(err.Error(), "client-quota") {
		t.Fatalf("over quota: %v", err)
	}
	if st := s.Stats(); st.Clients[0].RegisteredBytes != 2<<20 || len(st.Clients[0].Segments) != 1 {
		t.Fatalf("after refusal %+v", st.Clients[0])
	}
}

// Garbage, a truncated frame and a client that dies mid-put: the service keeps
// serving, and half-sent objects never become visible.
func TestBrokenClientsDoNotHurtTheService(t *testing.T) {
	s := start(t, nil)
	good := dial(t, s)
	r, seg := good.segment(1 << 20)
	_ = r
	// Garbage.
	conn, err := net.Dial("unix", s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	conn.Close()
	// A client that sends half a Put and dies.
	dying := dial(t, s)
	_, dseg := dying.segment(1 << 20)
	frame, err := wire.AppendFrame(nil, 9, wire.Put{Items: []wire.Item{item("half", dseg, 0, 4096)}})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := net.Dial("unix", s.Socket())
	hello, _ := wire.AppendFrame(nil, 1, wire.Hello{Version: wire.Version, ClientName: "raw"})
	raw.Write(hello)
	raw.Write(frame[:len(frame)/2])
	raw.Close()
	dying.conn.Close()
	// A client that speaks another protocol version is told so.
	old, _ := wire.Dial(context.Background(), s.Socket())
	defer old.Close()
	old.Send(context.Background(), wire.TypeHello, 1, wire.Hello{Version: 99})
	if _, m, _, err := old.Recv(context.Background()); err != nil || !strings.Contains(m.(*wire.Error).Message, "version") {
		t.Fatalf("old client: %v %v", m, err)
	}
	m, err := good.call(wire.TypeExists, wire.Exists{Keys: []string{"half"}, Format: 7})
	if err != nil || m.(*wire.ExistsReply).Present != 0 {
		t.Fatalf("a half-sent put is visible: %+v %v", m, err)
	}
	if res := good.batch(wire.TypePut, item("ok", seg, 0, 4096)); res[0].Status != wire.OK {
		t.Fatalf("service stopped serving: %+v", res)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(s.Stats().Clients) != 1 { // good alone: the others left or were sent away
		if time.Now().After(deadline) {
			t.Fatalf("dead clients not cleaned up: %+v", s.Stats().Clients)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An arena full of objects being read: puts fail cleanly with no space, and
// succeed again when the reads end.
func TestArenaFullOfLeasedObjects(t *testing.T) {
	s := start(t, func(c *Config) { c.ArenaBytes = 1 << 20 })
	c := dial(t, s)
	_, seg := c.segment(1 << 20)
	var keys []string
	for i := 0; ; i++ {
		k := fmt.Sprintf("k%d", i)
		if res := c.batch(wire.TypePut, item(k, seg, 0, 64<<10)); res[0].Status != wire.OK {
			break
		}
		keys = append(keys, k)
		if len(keys) == 14 {
			break
		}
	}
	var leases []interface{ Release() }
	for _, k := range keys {
		if l, err := s.arena.Acquire(k, 7); err == nil {
			leases = append(leases, l)
		}
	}
	res := c.batch(wire.TypePut, item("more", seg, 0, 256<<10))
	if res[0].Status != wire.NoSpace || !strings.Contains(res[0].Message, "--arena") {
		t.Fatalf("put into a leased-full arena: %+v", res[0])
	}
	for _, l := range leases {
		l.Release()
	}
	if res := c.batch(wire.TypePut, item("more", seg, 0, 256<<10)); res[0].Status != wire.OK {
		t.Fatalf("put after the leases ended: %+v", res[0])
	}
}

// Objects evicted from a small arena go to the spill directory and come back on a
// hit.
func TestSpillAndPromote(t *testing.T) {
	s := start(t, func(c *Config) { c.ArenaBytes = 1 << 20; c.SpillDir = t.TempDir() })
	c := dial(t, s)
	r, seg := c.segment(4 << 20)
	mem := r.Bytes()
	for i := 0; i < 32; i++ {
		for j := 0; j < 64<<10; j++ {
			mem[i*(64<<10)+j] = byte(i + j)
		}
		if res := c.batch(wire.TypePut, item(fmt.Sprintf("o%d", i), seg, uint64(i*(64<<10)), 64<<10)); res[0].Status != wire.OK {
			t.Fatalf("put %d: %+v", i, res[0])
		}
	}
	if st := s.Stats(); st.Arena.Spilled == 0 || st.Spill == nil || st.Spill.Files == 0 {
		t.Fatalf("nothing spilled: %+v", st.Arena)
	}
	// Exists counts across both tiers: the arena answers on its own only what it
	// holds, then the spill is asked.
	for _, tc := range []struct {
		keys []string
		want uint32
	}{
		{[]string{"o31", "o30"}, 2},
		{[]string{"o31", "o1", "o2", "missing", "o3"}, 3},
		{[]string{"o1", "o31"}, 2},
		{[]string{"missing", "o31"}, 0},
	} {
		m, err := c.call(wire.TypeExists, wire.Exists{Keys: tc.keys, Format: 7})
		if err != nil || m.(*wire.ExistsReply).Present != tc.want {
			t.Fatalf("exists %v: %+v %v, want %d", tc.keys, m, err, tc.want)
		}
	}
	// o0 was evicted long ago; read it back into another place.
	res := c.batch(wire.TypeGet, item("o0", seg, 3<<20, 64<<10))
	if res[0].Status != wire.OK {
		t.Fatalf("get of a spilled object: %+v", res[0])
	}
	for j := 0; j < 64<<10; j++ {
		if mem[3<<20+j] != byte(j) {
			t.Fatalf("spilled object byte %d differs", j)
		}
	}
	if st := s.Stats(); st.Ops.SpillHits != 1 || st.Ops.Promotions != 1 {
		t.Fatalf("ops %+v", st.Ops)
	}
}

func TestAdminEndpoints(t *testing.T) {
	s := start(t, nil)
	c := dial(t, s)
	c.segment(1 << 20)
	get := func(path string) string {
		resp, err := http.Get("http://" + s.AdminAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", path, resp.StatusCode)
		}
		return string(b)
	}
	if got := get("/healthz"); got != "ok\n" {
		t.Fatalf("healthz %q", got)
	}
	var st Stats
	if err := json.Unmarshal([]byte(get("/stats")), &st); err != nil || len(st.Clients) != 1 || st.Clients[0].Segments[0].Name != "kv" {
		t.Fatalf("stats %+v %v", st, err)
	}
	if m := get("/metrics"); !strings.Contains(m, "strata_node_registered_bytes 1.048576e+06") {
		t.Fatalf("metrics lack registered bytes:\n%s", m)
	}
	cfg := DefaultConfig(socketPath(t))
	cfg.Admin, cfg.ArenaBytes, cfg.Logger = "0.0.0.0:0", 1<<20, quiet
	if _, err := New(cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("non-loopback admin: %v", err)
	}
}
