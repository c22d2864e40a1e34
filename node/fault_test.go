package node

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/internal/redistest"
	"github.com/stratakv/strata/node/spill"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/storage"
	"github.com/stratakv/strata/storage/redisstore"
)

// lockedBuffer is a log sink that the service's goroutines may write at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

// unsealedSegment is what SGLang's ShmHostTensorAllocator makes: a memfd
// created with MFD_CLOEXEC only (so it can never be sealed), sized with
// ftruncate, mapped shared. flags adds MFD_HUGETLB.
func unsealedSegment(t *testing.T, size int, flags int) (int, []byte) {
	t.Helper()
	fd, err := unix.MemfdCreate("sglang_host_pool_test", unix.MFD_CLOEXEC|flags)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return fd, mem
}

func (c *rawClient) register(fd, size int, name string) uint32 {
	c.t.Helper()
	m, err := c.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: uint64(size), Name: name}, fd)
	if err != nil {
		c.t.Fatalf("register %s: %v", name, err)
	}
	return m.(*wire.RegisterSegmentReply).SegmentID
}

// bystander is a second client that puts and gets its own objects in a loop,
// checking every byte, until stop is closed. It runs on its own goroutine and
// reports failures through errs, never through t.
type bystander struct {
	rounds atomic.Int64
	errs   []error
	done   chan struct{}
}

func runBystander(t *testing.T, s *Server, stop <-chan struct{}) *bystander {
	t.Helper()
	c := dial(t, s)
	region, seg := c.segment(1 << 20)
	mem := region.Bytes()
	b := &bystander{done: make(chan struct{})}
	go func() {
		defer close(b.done)
		call := func(id uint64, typ wire.Type, msg wire.Message) ([]wire.Result, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := c.conn.Send(ctx, typ, id, msg); err != nil {
				return nil, err
			}
			h, m, _, err := c.conn.Recv(ctx)
			if err != nil {
				return nil, err
			}
			br, ok := m.(*wire.BatchReply)
			if h.ID != id || !ok {
				return nil, fmt.Errorf("reply %d %T to request %d", h.ID, m, id)
			}
			return br.Results, nil
		}
		const n, size = 8, 16 << 10
		for round := uint64(0); ; round++ {
			select {
			case <-stop:
				return
			default:
			}
			items := make([]wire.Item, n)
			back := make([]wire.Item, n)
			for i := range items {
				key := fmt.Sprintf("bystander-%d-%d", round, i)
				for j := 0; j < size; j++ {
					mem[i*size+j] = byte(int(round) + i + j)
				}
				items[i] = item(key, seg, uint64(i*size), size)
				back[i] = item(key, seg, uint64((n+i)*size), size)
			}
			res, err := call(2*round+1, wire.TypePut, wire.Put{Items: items})
			if err == nil {
				res2, err2 := call(2*round+2, wire.TypeGet, wire.Get{Items: back})
				res, err = append(res, res2...), err2
			}
			if err != nil {
				b.errs = append(b.errs, fmt.Errorf("round %d: %w", round, err))
				return
			}
			for i, r := range res {
				if r.Status != wire.OK {
					b.errs = append(b.errs, fmt.Errorf("round %d item %d: %v %s", round, i, r.Status, r.Message))
				}
			}
			if !bytes.Equal(mem[:n*size], mem[n*size:2*n*size]) {
				b.errs = append(b.errs, fmt.Errorf("round %d: bytes read back differ from bytes written", round))
			}
			if len(b.errs) > 0 {
				return
			}
			b.rounds.Add(1)
		}
	}()
	return b
}

// waitRounds waits until the bystander has finished more than after rounds.
func (b *bystander) waitRounds(t *testing.T, after int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for b.rounds.Load() <= after+1 {
		select {
		case <-b.done:
			return // failed: the caller reports b.errs
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the other client made no progress: %d rounds", b.rounds.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

func faulted(res []wire.Result) int {
	n := 0
	for _, r := range res {
		if r.Status == wire.BadRange && strings.Contains(r.Message, "faulted") {
			n++
		}
	}
	return n
}

// SGLang's host pools are unsealed memfds. A client that truncates one in the
// middle of its batches makes the service's copies fault: those items fail with
// a clear error, the segment is dropped and logged once, and the service goes on
// serving that client's other segments and every other client.
func TestUnsealedSegmentTruncatedMidBatch(t *testing.T) {
	logs := &lockedBuffer{}
	s := start(t, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	stop := make(chan struct{})
	other := runBystander(t, s, stop)
	defer func() {
		close(stop)
		<-other.done
		for _, err := range other.errs {
			t.Error("other client:", err)
		}
	}()

	c := dial(t, s)
	const size, part = 1 << 20, 64 << 10
	const parts = size / part
	putFD, putMem := unsealedSegment(t, size, 0)
	getFD, getMem := unsealedSegment(t, size, 0)
	putSeg := c.register(putFD, size, "kv")
	getSeg := c.register(getFD, size, "draft")
	for i := range putMem {
		putMem[i] = byte(i / 7)
		getMem[i] = byte(i / 5)
	}
	items := func(prefix string, seg uint32) []wire.Item {
		out := make([]wire.Item, parts)
		for i := range out {
			out[i] = item(fmt.Sprintf("%s-%d", prefix, i), seg, uint64(i*part), part)
		}
		return out
	}
	// Both segments work while whole.
	for _, res := range [][]wire.Result{c.batch(wire.TypePut, items("a", putSeg)...), c.batch(wire.TypePut, items("g", getSeg)...)} {
		for i, r := range res {
			if r.Status != wire.OK {
				t.Fatalf("put %d into a whole unsealed segment: %v %s", i, r.Status, r.Message)
			}
		}
	}
	other.waitRounds(t, 0)

	// Put from a segment whose second half is gone: the service reads faulting memory.
	if err := unix.Ftruncate(putFD, size/2); err != nil {
		t.Fatal(err)
	}
	before := other.rounds.Load()
	res := c.batch(wire.TypePut, items("b", putSeg)...)
	if faulted(res) == 0 {
		t.Fatalf("no item reported the fault: %+v", res)
	}
	for i, r := range res {
		if i >= parts/2 && r.Status == wire.OK {
			t.Fatalf("put item %d from the truncated half succeeded", i)
		}
		if r.Status != wire.OK && r.Status != wire.BadRange {
			t.Fatalf("put item %d: %v %s", i, r.Status, r.Message)
		}
	}
	// The objects of the failed items do not exist: nothing half-copied is visible.
	for i, r := range res {
		if r.Status == wire.OK {
			continue
		}
		m, err := c.call(wire.TypeExists, wire.Exists{Keys: []string{fmt.Sprintf("b-%d", i)}, Format: 7})
		if err != nil || m.(*wire.ExistsReply).Present != 0 {
			t.Fatalf("failed put b-%d left an object: %+v %v", i, m, err)
		}
	}

	// Get into a segment whose second half is gone: the service writes faulting memory.
	if err := unix.Ftruncate(getFD, size/2); err != nil {
		t.Fatal(err)
	}
	res = c.batch(wire.TypeGet, items("g", getSeg)...)
	if faulted(res) == 0 {
		t.Fatalf("no item reported the fault: %+v", res)
	}
	for i, r := range res {
		if i >= parts/2 && r.Status == wire.OK {
			t.Fatalf("get item %d into the truncated half reported success", i)
		}
	}
	other.waitRounds(t, before)

	// Both segments are dropped, each logged once; the connection and the service go on.
	for _, seg := range []uint32{putSeg, getSeg} {
		for _, op := range []wire.Type{wire.TypePut, wire.TypeGet} {
			r := c.batch(op, item("a-0", seg, 0, part))[0]
			if r.Status != wire.BadRange || !strings.Contains(r.Message, "not inside a segment this client registered") {
				t.Fatalf("%v on dropped segment %d: %v %s", op, seg, r.Status, r.Message)
			}
		}
	}
	if n := logs.count("client segment faulted"); n != 2 {
		t.Fatalf("%d fault warnings, want one per segment:\n%s", n, logs.b.String())
	}
	st := s.Stats()
	found := false
	for _, cl := range st.Clients {
		if cl.ID != 2 { // the bystander connected first
			continue
		}
		found = true
		if len(cl.Segments) != 0 || cl.RegisteredBytes != 0 || len(cl.Refused) != 2 || !strings.Contains(cl.Refused[0], "faulted") {
			t.Fatalf("client after the faults: %+v", cl)
		}
	}
	if !found {
		t.Fatalf("no client 2 in %+v", st.Clients)
	}
	// The client registers a new pool and carries on; its earlier objects are intact.
	fd, mem := unsealedSegment(t, size, 0)
	seg := c.register(fd, size, "kv")
	if r := c.batch(wire.TypeGet, item("a-3", seg, 0, part))[0]; r.Status != wire.OK {
		t.Fatalf("get after re-registering: %v %s", r.Status, r.Message)
	}
	for j := 0; j < part; j++ {
		if mem[j] != byte((3*part+j)/7) {
			t.Fatalf("object a-3 byte %d is %d, want %d", j, mem[j], byte((3*part+j)/7))
		}
	}
	other.waitRounds(t, other.rounds.Load())
}

// hugePages reads the huge page size and the free huge pages from /proc/meminfo.
func hugePages() (size, free int) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.Atoi(fields[1])
		switch fields[0] {
		case "Hugepagesize:":
			size = v << 10
		case "HugePages_Free:":
			free = v
		}
	}
	return size, free
}

// A hugetlb memfd is accepted. When the client punches a hole in it and no huge
// page is left to fill the hole, the service's copy into it faults: that get
// fails, the segment is dropped, and another client's batches go on.
func TestHugetlbSegmentHolePunched(t *testing.T) {
	hsize, free := hugePages()
	if hsize == 0 || free < 2 {
		t.Skipf("no free huge pages (HugePages_Free %d): set vm.nr_hugepages to 2 or more to run it", free)
	}
	logs := &lockedBuffer{}
	s := start(t, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	stop := make(chan struct{})
	other := runBystander(t, s, stop)
	defer func() {
		close(stop)
		<-other.done
		for _, err := range other.errs {
			t.Error("other client:", err)
		}
	}()

	c := dial(t, s)
	size := 2 * hsize
	fd, mem := unsealedSegment(t, size, unix.MFD_HUGETLB)
	for i := range mem {
		mem[i] = byte(i / 3)
	}
	seg := c.register(fd, size, "kv")
	const part = 64 << 10
	put := []wire.Item{item("h-0", seg, 0, part), item("h-1", seg, uint64(hsize), part)}
	for i, r := range c.batch(wire.TypePut, put...) {
		if r.Status != wire.OK {
			t.Fatalf("put %d from a hugetlb segment: %v %s", i, r.Status, r.Message)
		}
	}
	other.waitRounds(t, 0)

	// Punch out the second huge page, then take every free huge page so that the
	// service's write into the hole cannot be backed.
	if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(hsize), int64(hsize)); err != nil {
		t.Fatal(err)
	}
	if _, free := hugePages(); free > 0 {
		hog, err := unix.Mmap(-1, 0, free*hsize, unix.PROT_READ|unix.PROT_WRITE,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_HUGETLB|unix.MAP_POPULATE)
		if err != nil {
			t.Skipf("cannot take the %d free huge pages to make the hole unfillable: %v", free, err)
		}
		defer unix.Munmap(hog)
	}
	before := other.rounds.Load()
	res := c.batch(wire.TypeGet, item("h-0", seg, uint64(hsize)+part, part), item("h-1", seg, uint64(hsize), part))
	if faulted(res) == 0 {
		t.Fatalf("no item reported the fault: %+v", res)
	}
	if res[1].Status == wire.OK {
		t.Fatal("a get into the punched hole reported success")
	}
	other.waitRounds(t, before)
	if n := logs.count("client segment faulted"); n != 1 {
		t.Fatalf("%d fault warnings, want 1", n)
	}
	if _, err := c.call(wire.TypePing, wire.Ping{Nonce: 3}); err != nil {
		t.Fatalf("the client's connection after the fault: %v", err)
	}
}

// pattern fills b with bytes that depend on seed and position.
func pattern(b []byte, seed int) {
	for i := range b {
		b[i] = byte(i/11 + seed)
	}
}

// checkFaulted fails t unless the get's single result is the fault of a
// truncated segment.
func checkFaulted(t *testing.T, what string, res []wire.Result) {
	t.Helper()
	if len(res) != 1 || faulted(res) != 1 {
		t.Fatalf("%s into a truncated segment: %+v, want a BadRange that names the fault", what, res)
	}
}

// A get that the spill serves while the arena has no room for the object reads
// it from the SSD into a buffer of the service's own and copies it to the client
// under the fault guard: a client that truncated its segment gets a clear error
// and loses that segment, and the service goes on serving.
func TestSpillReadWithoutRoomIntoTruncatedSegment(t *testing.T) {
	const big = 2 << 20 // larger than the whole arena: never promoted
	dir := t.TempDir()
	sc := spill.DefaultConfig(dir)
	sc.Logger = quiet
	fs, err := spill.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{}
	for i, key := range []string{"big-ok", "big-bad"} {
		want[key] = make([]byte, big)
		pattern(want[key], i)
		if err := fs.PutObject(context.Background(), key, storage.Format(7), want[key]); err != nil {
			t.Fatal(err)
		}
	}
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}

	logs := &lockedBuffer{}
	s := start(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
		c.ArenaBytes = 1 << 20
		c.SpillDir = dir
	})
	waitSpillReady(t, s)
	stop := make(chan struct{})
	other := runBystander(t, s, stop)
	defer func() {
		close(stop)
		<-other.done
		for _, err := range other.errs {
			t.Error("other client:", err)
		}
	}()
	c := dial(t, s)
	const size = 2 * big
	fd, mem := unsealedSegment(t, size, 0)
	seg := c.register(fd, size, "kv")
	// Whole, the segment gets the object's bytes through the service's buffer.
	if r := c.batch(wire.TypeGet, item("big-ok", seg, 0, big))[0]; r.Status != wire.OK {
		t.Fatalf("get from the spill without room: %v %s", r.Status, r.Message)
	}
	if !bytes.Equal(mem[:big], want["big-ok"]) {
		t.Fatal("the spill served wrong bytes")
	}
	other.waitRounds(t, 0)

	if err := unix.Ftruncate(fd, big+big/2); err != nil {
		t.Fatal(err)
	}
	before := other.rounds.Load()
	checkFaulted(t, "spill get without room", c.batch(wire.TypeGet, item("big-bad", seg, big, big)))
	other.waitRounds(t, before)
	if r := c.batch(wire.TypeGet, item("big-ok", seg, 0, big))[0]; r.Status != wire.BadRange || !strings.Contains(r.Message, "not inside a segment") {
		t.Fatalf("get into the dropped segment: %v %s", r.Status, r.Message)
	}
	if n := logs.count("client segment faulted"); n != 1 {
		t.Fatalf("%d fault warnings, want 1:\n%s", n, logs.b.String())
	}
	if st := s.Stats(); st.Ops.SpillHits != 1 {
		t.Fatalf("spill hits %d, want 1 (the faulted get is not one)", st.Ops.SpillHits)
	}
}

// A get that Redis serves copies into the client's memory under the fault
// guard on both of its paths: promoted through the arena (the copy's fault used
// to be ignored, and the get reported OK), and, when the arena has no room,
// through a buffer of the service's own (Redis used to write straight into the
// client's memory, on its own goroutines).
func TestRemoteFetchIntoTruncatedSegment(t *testing.T) {
	redis := redistest.Start(t)
	// big is larger than the whole arena; the arena is large enough that the
	// other client's objects stay in it until it reads them back (there is no
	// spill), and small stays in it once promoted.
	const small, big, arenaBytes = 64 << 10, 6 << 20, 4 << 20
	ctx := context.Background()
	rc := redisstore.DefaultConfig(redis.Addr())
	rc.Logger = quiet
	rs, err := redisstore.New(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{}
	var objs []redisstore.Object
	for i, key := range []string{"small-ok", "big-ok", "small-bad", "big-bad"} {
		n := small
		if strings.HasPrefix(key, "big") {
			n = big
		}
		want[key] = make([]byte, n)
		pattern(want[key], i)
		objs = append(objs, redisstore.Object{Name: key, Format: storage.Format(7), Runs: [][]byte{want[key]}})
	}
	for i, err := range rs.PutObjects(ctx, objs) {
		if err != nil {
			t.Fatalf("put %s into Redis: %v", objs[i].Name, err)
		}
	}
	if err := rs.Close(); err != nil {
		t.Fatal(err)
	}

	logs := &lockedBuffer{}
	s := start(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
		c.ArenaBytes = arenaBytes
		c.RemoteAddrs = []string{redis.Addr()}
	})
	waitRemoteConnected(t, s)
	stop := make(chan struct{})
	other := runBystander(t, s, stop)
	defer func() {
		close(stop)
		<-other.done
		for _, err := range other.errs {
			t.Error("other client:", err)
		}
	}()
	c := dial(t, s)
	const size = 2 * big
	var fds [3]int
	var mems [3][]byte
	var segs [3]uint32
	for i := range fds {
		fds[i], mems[i] = unsealedSegment(t, size, 0)
		segs[i] = c.register(fds[i], size, fmt.Sprintf("kv%d", i))
	}
	// Whole, a segment gets the objects' bytes by both paths.
	res := c.batch(wire.TypeGet, item("small-ok", segs[0], 0, small), item("big-ok", segs[0], big, big))
	if res[0].Status != wire.OK || res[1].Status != wire.OK {
		t.Fatalf("get from Redis into a whole segment: %+v", res)
	}
	if !bytes.Equal(mems[0][:small], want["small-ok"]) || !bytes.Equal(mems[0][big:], want["big-ok"]) {
		t.Fatal("Redis served wrong bytes")
	}
	other.waitRounds(t, 0)

	for i := 1; i < 3; i++ {
		if err := unix.Ftruncate(fds[i], big/2); err != nil {
			t.Fatal(err)
		}
	}
	before := other.rounds.Load()
	checkFaulted(t, "Redis get through the arena", c.batch(wire.TypeGet, item("small-bad", segs[1], big, small)))
	// The object whose copy to the client faulted was promoted whole, for the
	// next reader.
	if !s.arena.Contains("small-bad", 7) {
		t.Fatal("the object whose copy to the client faulted was not promoted")
	}
	checkFaulted(t, "Redis get without room", c.batch(wire.TypeGet, item("big-bad", segs[2], big, big)))
	other.waitRounds(t, before)
	if n := logs.count("client segment faulted"); n != 2 {
		t.Fatalf("%d fault warnings, want one per segment:\n%s", n, logs.b.String())
	}
	if r := c.batch(wire.TypeGet, item("small-bad", segs[0], 0, small))[0]; r.Status != wire.OK || !bytes.Equal(mems[0][:small], want["small-bad"]) {
		t.Fatalf("get of the promoted object: %v %s", r.Status, r.Message)
	}
}

// Objects the arena spilled survive a restart of the service: the new one
// finds them in the spill's segment files, checks them and serves them; the
// spill's state is on /stats and /metrics.
func TestSpillSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	const n, size = 32, 64 << 10
	tweak := func(c *Config) { c.ArenaBytes = 1 << 20; c.SpillDir = dir }
	s := start(t, tweak)
	c := dial(t, s)
	r, seg := c.segment(n * size)
	want := make([]byte, n*size)
	pattern(want, 3)
	copy(r.Bytes(), want)
	for i := 0; i < n; i++ {
		if res := c.batch(wire.TypePut, item(fmt.Sprintf("o%d", i), seg, uint64(i*size), size)); res[0].Status != wire.OK {
			t.Fatalf("put %d: %+v", i, res[0])
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Counted once the arena's evictor stopped.
	spilled := s.spill.Stats().Objects
	if spilled == 0 {
		t.Fatal("nothing spilled")
	}

	s = start(t, tweak)
	waitSpillReady(t, s)
	st := s.Stats()
	if st.Spill == nil || st.Spill.Recovered != spilled || st.Spill.TornTails != 0 {
		t.Fatalf("after the restart the spill holds %+v, want the %d objects spilled before", st.Spill, spilled)
	}
	c = dial(t, s)
	r, seg = c.segment(n * size)
	clear(r.Bytes())
	served := 0
	for i := 0; i < n; i++ {
		res := c.batch(wire.TypeGet, item(fmt.Sprintf("o%d", i), seg, uint64(i*size), size))
		switch res[0].Status {
		case wire.OK:
			if !bytes.Equal(r.Bytes()[i*size:(i+1)*size], want[i*size:(i+1)*size]) {
				t.Fatalf("o%d: wrong bytes after the restart", i)
			}
			served++
		case wire.NotFound: // in the arena at the close, and dropped with it
		default:
			t.Fatalf("get o%d: %+v", i, res[0])
		}
	}
	if int64(served) != spilled {
		t.Fatalf("%d objects served after the restart, %d were spilled", served, spilled)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(s))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, mf := range mfs {
		found[mf.GetName()] = true
	}
	for _, name := range []string{"strata_node_spill_objects", "strata_node_spill_segments", "strata_node_spill_reads_total", "strata_node_spill_dropped_total"} {
		if !found[name] {
			t.Errorf("metric %s missing from /metrics", name)
		}
	}
}

// --spill-segment sizes the spill's segment files; a size the spill cannot
// use is refused by Validate, naming the flag.
func TestSpillSegmentConfig(t *testing.T) {
	for _, n := range []int64{4096, 65 << 30} {
		c := DefaultConfig("/tmp/s.sock")
		c.SpillDir, c.SpillSegmentBytes = t.TempDir(), n
		if err := c.Validate(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "--spill-segment") {
			t.Errorf("segments of %d bytes: %v", n, err)
		}
	}
	s := start(t, func(c *Config) { c.SpillDir = t.TempDir(); c.SpillSegmentBytes = 2 << 20 })
	if st := s.Stats(); st.Spill == nil || st.Spill.SegmentBytes != 2<<20 {
		t.Fatalf("spill %+v, want segments of 2 MiB", st.Spill)
	}
}
