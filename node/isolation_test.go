package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/internal/redistest"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/storage"
)

// A sparse memfd (ftruncate only) is registered without the service allocating
// its memory: before, MADV_POPULATE_WRITE at registration allocated every page
// on the service's account (2 GiB each, seconds per registration, and an OOM
// kill in a small memory cgroup). A fully backed one is still served.
func TestRegisteringASparseSegmentAllocatesNothing(t *testing.T) {
	s := start(t, nil)
	c := dial(t, s)
	const size = 64 << 20
	fd, _ := unsealedSegment(t, size, 0)
	seg := c.register(fd, size, "sparse")
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks != 0 {
		t.Fatalf("registering a sparse memfd of %d bytes allocated %d bytes of it", size, st.Blocks*512)
	}
	// The segment works: the pages a put reads come into being on first use.
	if res := c.batch(wire.TypePut, item("sparse:0", seg, 1<<20, 4096)); res[0].Status != wire.OK {
		t.Fatalf("put from a sparse segment: %+v", res)
	}
	if res := c.batch(wire.TypeGet, item("sparse:0", seg, 8<<20, 4096)); res[0].Status != wire.OK {
		t.Fatalf("get into a sparse segment: %+v", res)
	}
}

// Config.MaxRegisteredBytes bounds what every client together registers; a
// client's memory is given back when it goes.
func TestMaxRegisteredBytesIsNodeWide(t *testing.T) {
	s := start(t, func(c *Config) { c.MaxRegisteredBytes = 3 << 20 })
	a, b := dial(t, s), dial(t, s)
	a.segment(2 << 20)
	fd, _ := unsealedSegment(t, 2<<20, 0)
	_, err := b.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: 2 << 20, Name: "b"}, fd)
	if !errors.Is(err, wire.Quota.Error()) || !strings.Contains(err.Error(), "--max-registered") {
		t.Fatalf("registration over the node-wide bound: %v", err)
	}
	small, _ := unsealedSegment(t, 1<<20, 0)
	b.register(small, 1<<20, "fits")
	a.conn.Close()
	deadline := time.Now().Add(10 * time.Second)
	for s.registeredBytes.Load() != 1<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("registered bytes %d after the first client left, want %d", s.registeredBytes.Load(), 1<<20)
		}
		time.Sleep(time.Millisecond)
	}
}

// A Put of a key that exists in another format answers FORMAT_MISMATCH, from
// the arena and from the spill: before, it answered ok and stored nothing.
func TestPutInAnotherFormatIsAMismatch(t *testing.T) {
	s := start(t, func(c *Config) { c.SpillDir = t.TempDir() })
	c := dial(t, s)
	r, seg := c.segment(1 << 20)
	copy(r.Bytes(), "format seven")
	if res := c.batch(wire.TypePut, item("k", seg, 0, 4096)); res[0].Status != wire.OK {
		t.Fatalf("put: %+v", res)
	}
	other := item("k", seg, 0, 4096)
	other.Format = 8
	res := c.batch(wire.TypePut, other)
	if res[0].Status != wire.FormatMismatch || !strings.Contains(res[0].Message, "another format") {
		t.Fatalf("put in another format, arena: %+v", res)
	}
	// The same from the spill directory.
	if err := s.spill.PutObject(context.Background(), "spilled", storage.Format(9), make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	if res := c.batch(wire.TypePut, item("spilled", seg, 0, 4096)); res[0].Status != wire.FormatMismatch {
		t.Fatalf("put in another format, spill: %+v", res)
	}
	if res := c.batch(wire.TypePut, item("spilled2", seg, 0, 4096)); res[0].Status != wire.OK {
		t.Fatalf("put of a new key: %+v", res)
	}
}

// Every key the wire accepts can be evicted to the spill and read back: before,
// keys that were not valid file names (a space, '/', more than 222 bytes) were
// lost on eviction, and their gets answered internal.
func TestEveryWireKeySurvivesTheSpill(t *testing.T) {
	s := start(t, func(c *Config) { c.SpillDir = t.TempDir() })
	c := dial(t, s)
	r, seg := c.segment(8 << 20)
	mem := r.Bytes()
	keys := []string{"meta-llama/Llama-3.1-8B:00ff_0_k", "a key with spaces", strings.Repeat("x", wire.MaxKey),
		"../../escape", ".hidden", "~!@#$%^&*()[]{}|\\;'\",<>?`"}
	var items []wire.Item
	for i, k := range keys {
		for j := range 4096 {
			mem[i*4096+j] = byte(i*31 + j)
		}
		items = append(items, item(k, seg, uint64(i*4096), 4096))
	}
	for _, res := range c.batch(wire.TypePut, items...) {
		if res.Status != wire.OK {
			t.Fatalf("put: %+v", res)
		}
	}
	// Push them out of the 16 MiB arena with newer objects.
	inArena := func() bool {
		for _, k := range keys {
			if s.arena.Contains(k, 7) {
				return true
			}
		}
		return false
	}
	for i := 0; inArena(); i++ {
		if i > 64 {
			t.Fatalf("the arena never evicted the test's keys: %+v", s.Stats().Arena)
		}
		var fill []wire.Item
		for j := range 8 {
			fill = append(fill, item(fmt.Sprintf("fill:%d:%d", i, j), seg, 4<<20, 1<<20))
		}
		c.batch(wire.TypePut, fill...)
	}
	var gets []wire.Item
	for i, k := range keys {
		gets = append(gets, item(k, seg, uint64(2<<20+i*4096), 4096))
	}
	for i, res := range c.batch(wire.TypeGet, gets...) {
		if res.Status != wire.OK {
			t.Fatalf("get of evicted key %q: %+v (spill errors %d)", keys[i], res, s.st.spillErrors.Load())
		}
		if !bytes.Equal(mem[2<<20+i*4096:2<<20+(i+1)*4096], mem[i*4096:(i+1)*4096]) {
			t.Fatalf("key %q read back other bytes", keys[i])
		}
	}
}

// dialAs connects to s with effective uid uid, so that the service's
// SO_PEERCRED sees that user: the credentials are changed on one locked OS
// thread only (a raw setresuid is per thread) and changed back before the
// thread is unlocked. The thread must not exit instead: a child process forked
// from it earlier (redis-server, with Pdeathsig) would be killed with it.
func dialAs(t *testing.T, s *Server, uid int) *rawClient {
	t.Helper()
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			runtime.UnlockOSThread()
			ch <- result{-1, e}
			return
		}
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err == nil {
			if err = unix.Connect(fd, &unix.SockaddrUnix{Name: s.Socket()}); err != nil {
				unix.Close(fd)
			}
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0)); e != 0 {
			// Still the other user: keep the thread locked, so it exits with
			// this goroutine rather than run anything else.
			ch <- result{-1, e}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{fd, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("connect as uid %d: %v", uid, r.err)
	}
	f := os.NewFile(uintptr(r.fd), "as-uid")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	c := &rawClient{t: t, conn: wire.NewConn(nc.(*net.UnixConn))}
	t.Cleanup(func() { c.conn.Close() })
	if _, err := c.call(wire.TypeHello, wire.Hello{Version: wire.Version, ClientName: "uid"}); err != nil {
		t.Fatal(err)
	}
	return c
}

// startShared starts a service whose socket any user may connect to.
func startShared(t *testing.T, tweak func(*Config)) *Server {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("tenancy tests connect as another uid and need root; CI runs as root")
		}
		t.Skip("tenancy tests connect as another uid: run as root")
	}
	s := start(t, func(c *Config) {
		c.SocketMode = 0o666
		if tweak != nil {
			tweak(c)
		}
	})
	if err := os.Chmod(filepath.Dir(s.Socket()), 0o755); err != nil {
		t.Fatal(err)
	}
	return s
}

// Users sharing a socket cannot read, remove or poison each other's objects:
// before, another user's Put of a key first won, and the owner's later Put
// answered ok and read the poison back.
func TestTenantsAreIsolatedByUID(t *testing.T) {
	s := startShared(t, func(c *Config) { c.SpillDir = t.TempDir() })
	owner, other := dial(t, s), dialAs(t, s, 4242)
	ro, so := owner.segment(1 << 20)
	rx, sx := other.segment(1 << 20)
	copy(rx.Bytes(), "poison")
	if res := other.batch(wire.TypePut, item("model:page0", sx, 0, 4096)); res[0].Status != wire.OK {
		t.Fatalf("other user's put: %+v", res)
	}
	m, err := owner.call(wire.TypeExists, wire.Exists{Keys: []string{"model:page0"}, Format: 7})
	if err != nil || m.(*wire.ExistsReply).Present != 0 {
		t.Fatalf("owner sees the other user's object: %+v %v", m, err)
	}
	if res := owner.batch(wire.TypeGet, item("model:page0", so, 0, 4096)); res[0].Status != wire.NotFound {
		t.Fatalf("owner reads the other user's object: %+v", res)
	}
	copy(ro.Bytes(), "genuine")
	if res := owner.batch(wire.TypePut, item("model:page0", so, 0, 4096), item("owner-only", so, 0, 4096)); res[0].Status != wire.OK || res[1].Status != wire.OK {
		t.Fatalf("owner's put: %+v", res)
	}
	// Exists is answered in the asker's namespace too.
	m, err = other.call(wire.TypeExists, wire.Exists{Keys: []string{"owner-only"}, Format: 7})
	if err != nil || m.(*wire.ExistsReply).Present != 0 {
		t.Fatalf("the other user sees the owner's object: %+v %v", m, err)
	}
	m, err = other.call(wire.TypeExists, wire.Exists{Keys: []string{"model:page0"}, Format: 7})
	if err != nil || m.(*wire.ExistsReply).Present != 1 {
		t.Fatalf("the other user does not see its own object: %+v %v", m, err)
	}
	if res := owner.batch(wire.TypeGet, item("model:page0", so, 8192, 4096)); res[0].Status != wire.OK || string(ro.Bytes()[8192:8199]) != "genuine" {
		t.Fatalf("owner reads back %q, %+v", ro.Bytes()[8192:8199], res)
	}
	m, err = other.call(wire.TypeRemove, wire.Remove{Keys: []string{"model:page0"}})
	if err != nil || m.(*wire.RemoveReply).Removed != 1 { // its own
		t.Fatalf("other user's remove: %+v %v", m, err)
	}
	m, err = other.call(wire.TypeRemove, wire.Remove{Keys: []string{"model:page0"}})
	if err != nil || m.(*wire.RemoveReply).Removed != 0 {
		t.Fatalf("other user's second remove: %+v %v", m, err)
	}
	if res := owner.batch(wire.TypeGet, item("model:page0", so, 8192, 4096)); res[0].Status != wire.OK {
		t.Fatalf("the other user removed the owner's object: %+v", res)
	}
	// The namespace travels with the key into the spill directory.
	if err := s.spill.PutObject(context.Background(), "\x00uid:4242\x00spilled", 7, []byte("theirs")); err != nil {
		t.Fatal(err)
	}
	if res := owner.batch(wire.TypeGet, item("spilled", so, 0, 6)); res[0].Status != wire.NotFound {
		t.Fatalf("owner reads the other user's spilled object: %+v", res)
	}
	if res := other.batch(wire.TypeGet, item("spilled", sx, 100, 6)); res[0].Status != wire.OK || string(rx.Bytes()[100:106]) != "theirs" {
		t.Fatalf("other user's spilled object: %+v", res)
	}
}

// A tenant group shares one namespace: the usual deployment, every engine of it
// under its own uid.
func TestTenantGroupSharesObjects(t *testing.T) {
	s := startShared(t, func(c *Config) { c.TenantGroups = [][]int{{4242, 4243}} })
	a, b, root := dialAs(t, s, 4242), dialAs(t, s, 4243), dial(t, s)
	ra, sa := a.segment(1 << 20)
	rb, sb := b.segment(1 << 20)
	_, sr := root.segment(1 << 20)
	copy(ra.Bytes(), "shared")
	if res := a.batch(wire.TypePut, item("k", sa, 0, 4096)); res[0].Status != wire.OK {
		t.Fatalf("put: %+v", res)
	}
	if res := b.batch(wire.TypeGet, item("k", sb, 0, 4096)); res[0].Status != wire.OK || string(rb.Bytes()[:6]) != "shared" {
		t.Fatalf("group member's get: %+v", res)
	}
	if res := root.batch(wire.TypeGet, item("k", sr, 0, 4096)); res[0].Status != wire.NotFound {
		t.Fatalf("a user outside the group reads its object: %+v", res)
	}
}

func TestTenantGroupsConfig(t *testing.T) {
	g, err := ParseTenantGroups("1000, 1001; 2000;;0")
	if err != nil || len(g) != 3 || len(g[0]) != 2 || g[0][1] != 1001 || g[1][0] != 2000 || g[2][0] != 0 {
		t.Fatalf("ParseTenantGroups = %v, %v", g, err)
	}
	if _, err := ParseTenantGroups("no-such-user-here"); !errors.Is(err, ErrConfig) {
		t.Fatalf("unknown user: %v", err)
	}
	if _, err := newTenants([][]int{{1, 2}, {2, 3}}, 0); !errors.Is(err, ErrConfig) {
		t.Fatalf("a uid in two groups: %v", err)
	}
	tn, err := newTenants([][]int{{1000, 1001}, {0, 5}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case tn.namespace(1000, true, 1) != tn.namespace(1001, true, 2):
		t.Error("group members in different namespaces")
	case tn.namespace(5, true, 1) != "" || tn.namespace(0, true, 1) != "":
		t.Error("the service's own group is not the unprefixed namespace")
	case tn.namespace(7, true, 1) == tn.namespace(8, true, 1) || tn.namespace(7, true, 1) == "":
		t.Error("two users share a namespace")
	case tn.namespace(7, false, 1) == tn.namespace(7, false, 2):
		t.Error("connections of unknown uid share a namespace")
	}
}

// A spill directory on a small device under the default 64 GiB spill capacity:
// the spill follows the device's free space and evicts its own least recently
// used objects. Before, every eviction past the device's size failed with
// ENOSPC and was dropped (and logged), and nothing was ever evicted.
func TestSpillOnAFullDevice(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("mounting a tmpfs needs root; CI runs as root")
		}
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4m,mode=0700"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("cannot mount a tmpfs as root: %v", err)
		}
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	s := start(t, func(c *Config) { c.SpillDir = dir })
	c := dial(t, s)
	r, seg := c.segment(2 << 20)
	mem := r.Bytes()
	// 40 MiB of 256 KiB objects through a 16 MiB arena and a 4 MiB device.
	const n, size = 160, 256 << 10
	for i := 0; i < n; i += 4 {
		var items []wire.Item
		for j := i; j < i+4; j++ {
			mem[j%4*size] = byte(j)
			items = append(items, item(fmt.Sprintf("obj/%d", j), seg, uint64(j%4*size), size))
		}
		for _, res := range c.batch(wire.TypePut, items...) {
			if res.Status != wire.OK {
				t.Fatalf("put: %+v", res)
			}
		}
	}
	if e := s.st.spillErrors.Load(); e != 0 {
		t.Fatalf("%d evicted objects dropped by the spill; want its own LRU evicted instead", e)
	}
	// Some object evicted from the arena lately is served from the spill.
	served := 0
	for j := n - 1; j >= 0 && served == 0; j-- {
		k := fmt.Sprintf("obj/%d", j)
		if s.arena.Contains(k, 7) {
			continue
		}
		res := c.batch(wire.TypeGet, item(k, seg, 1<<20, size))
		switch {
		case res[0].Status == wire.OK && mem[1<<20] == byte(j):
			served++
		case res[0].Status != wire.NotFound:
			t.Fatalf("get of %s: %+v", k, res[0])
		}
	}
	if served == 0 {
		t.Fatal("no evicted object is served from the spill")
	}
}

// The namespace travels with the key into Redis: on a second node sharing the
// Redis, the object a user wrote through is that user's only.
func TestTenantNamespaceReachesRedis(t *testing.T) {
	redis := redistest.Start(t)
	remote := func(c *Config) { c.RemoteAddrs = []string{redis.Addr()} }
	a, b := startShared(t, remote), startShared(t, remote)
	waitRemoteConnected(t, a)
	waitRemoteConnected(t, b)
	writer := dialAs(t, a, 4242)
	rw, sw := writer.segment(1 << 20)
	copy(rw.Bytes(), "tenant page")
	if res := writer.batch(wire.TypePut, item("shared/key", sw, 0, 4096)); res[0].Status != wire.OK {
		t.Fatalf("put: %+v", res)
	}
	waitWritten(t, a, 1)
	root, same := dial(t, b), dialAs(t, b, 4242)
	_, sr := root.segment(1 << 20)
	rs, ss := same.segment(1 << 20)
	if res := root.batch(wire.TypeGet, item("shared/key", sr, 0, 4096)); res[0].Status != wire.NotFound {
		t.Fatalf("another user reads the object from Redis: %+v", res)
	}
	if res := same.batch(wire.TypeGet, item("shared/key", ss, 0, 4096)); res[0].Status != wire.OK || string(rs.Bytes()[:11]) != "tenant page" {
		t.Fatalf("the same user on another node: %+v", res)
	}
}

// statsOver asks for the Stats document over c's socket.
func statsOver(t *testing.T, c *rawClient) (Stats, string) {
	t.Helper()
	m, err := c.call(wire.TypeStats, wire.Stats{})
	if err != nil {
		t.Fatal(err)
	}
	doc := m.(*wire.StatsReply).JSON
	var st Stats
	if err := json.Unmarshal(doc, &st); err != nil {
		t.Fatalf("stats document: %v", err)
	}
	return st, string(doc)
}

// A client of another user sees, in its Stats over the socket, its own
// tenant's clients and the service's totals, nothing that names or counts
// another tenant; the service's own user sees everyone. Before, any user of the
// socket read every client's name, pid, uid, segments and activity, whatever
// --admin-stats said.
func TestStatsShowAClientItsOwnTenantOnly(t *testing.T) {
	for _, adminStats := range []string{AdminStatsFull, AdminStatsCounts} {
		t.Run(adminStats, func(t *testing.T) {
			s := startShared(t, func(c *Config) { c.AdminStats = adminStats; c.TenantGroups = [][]int{{4243, 4244}} })
			root := dial(t, s)
			a, _ := hostmem.New(hostmem.Config{Kind: hostmem.Shm})
			r, err := a.Allocate("test", 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() })
			if _, err := root.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: uint64(r.Size()), Name: "root-secret-pool"}, r.Fd()); err != nil {
				t.Fatal(err)
			}
			loner := dialAs(t, s, 4242)
			_, seg := loner.segment(1 << 20)
			loner.batch(wire.TypePut, item("loner-key", seg, 0, 4096))
			g1, g2 := dialAs(t, s, 4243), dialAs(t, s, 4244)
			g1.segment(2 << 20)
			g2.segment(1 << 20)

			st, doc := statsOver(t, loner)
			if st.Scope != ScopeTenant || st.ClientCount != 1 || len(st.Clients) != 1 || st.Clients[0].UID != 4242 ||
				st.SegmentCount != 1 || st.RegisteredBytes != 1<<20 {
				t.Fatalf("a lone tenant's stats: scope %q, %d clients %+v, %d segments, %d bytes", st.Scope, st.ClientCount, st.Clients, st.SegmentCount, st.RegisteredBytes)
			}
			for _, secret := range []string{"root-secret-pool", t.Name(), `"uid":0`, `"uid":4243`, `"uid":4244`} {
				if strings.Contains(doc, secret) {
					t.Errorf("a tenant's stats name another tenant: %q in %s", secret, doc)
				}
			}
			if st.Ops.Puts != 1 || st.Arena.Objects != 1 {
				t.Errorf("the service's totals are missing: ops %+v, arena objects %d", st.Ops, st.Arena.Objects)
			}
			// A tenant group is one tenant: its members see each other.
			st, _ = statsOver(t, g1)
			if st.Scope != ScopeTenant || st.ClientCount != 2 || st.SegmentCount != 2 || st.RegisteredBytes != 3<<20 {
				t.Fatalf("a tenant group's stats: scope %q, %d clients, %d segments, %d bytes", st.Scope, st.ClientCount, st.SegmentCount, st.RegisteredBytes)
			}
			for _, c := range st.Clients {
				if c.UID != 4243 && c.UID != 4244 {
					t.Errorf("a group's stats show client %+v", c)
				}
			}
			// The service's own user sees every client.
			st, doc = statsOver(t, root)
			if st.Scope != ScopeService || st.ClientCount != 4 || !strings.Contains(doc, "root-secret-pool") {
				t.Fatalf("the service user's stats: scope %q, %d clients", st.Scope, st.ClientCount)
			}
		})
	}
}
