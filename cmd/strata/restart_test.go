package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node"
	"github.com/stratakv/strata/node/wire"
)

// Restarts of a real `strata serve` process on an arena file: killed with
// SIGKILL while clients put, while the arena evicts to the spill, stopped with
// SIGTERM under load, restarted on an arena file of another geometry or a
// damaged one, two at once on one file, and a rolling restart while clients
// keep putting and getting. The clients verify every byte they read: objects
// hold bytes derived from their keys.

// shmArenaDir is a fresh directory on a tmpfs for arena files (/dev/shm);
// outside CI a machine without one skips, under CI=true it fails.
func shmArenaDir(t testing.TB, need int64) string {
	t.Helper()
	skip := func(why string) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("restart tests need a tmpfs at /dev/shm with %s free: %s", hostmem.FormatBytes(need), why)
		}
		t.Skipf("no tmpfs for arena files: %s", why)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &fs); err != nil {
		skip(err.Error())
	}
	if fs.Type != unix.TMPFS_MAGIC {
		skip(fmt.Sprintf("/dev/shm is a file system of type %#x", fs.Type))
	}
	if free := int64(fs.Bavail) * fs.Bsize; free < need {
		skip(fmt.Sprintf("/dev/shm has %s free", hostmem.FormatBytes(free)))
	}
	dir, err := os.MkdirTemp("/dev/shm", "strata-restart-")
	if err != nil {
		skip(err.Error())
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// serveChild is a `strata serve` process and its log.
type serveChild struct {
	cmd    *exec.Cmd
	log    *syncBuffer
	exited chan struct{}
	err    error // its exit, once exited is closed
}

// startServeOn starts `strata serve` on socket with the arena file and
// flags args, and waits until it answers.
func startServeOn(t *testing.T, socket string, args ...string) *serveChild {
	t.Helper()
	s := spawnServe(t, socket, args...)
	waitAnswers(t, s, socket)
	return s
}

func spawnServe(t testing.TB, socket string, args ...string) *serveChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"serve", "--socket", socket, "--admin", "", "--log-level", "info"}, args...)...)
	cmd.Env = append(os.Environ(), "STRATA_TEST_AS_MAIN=1")
	s := &serveChild{cmd: cmd, log: &syncBuffer{}, exited: make(chan struct{})}
	var out io.Writer = s.log
	if testing.Verbose() {
		out = io.MultiWriter(s.log, os.Stderr)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.err = cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-s.exited
	})
	return s
}

// waitAnswers waits until the service at socket answers Stats.
func waitAnswers(t *testing.T, s *serveChild, socket string) node.Stats {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, _, err := fetchStats(ctx, socket)
		cancel()
		if err == nil {
			return st
		}
		select {
		case <-s.exited:
			t.Fatalf("strata serve exited (%v) before answering; log:\n%s", s.err, s.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("strata serve did not answer within 60 s: %v; log:\n%s", err, s.log.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitReady waits until the service says it is done starting.
func waitReady(t *testing.T, socket string) node.Stats {
	t.Helper()
	deadline := time.Now().Add(120 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, _, err := fetchStats(ctx, socket)
		cancel()
		if err == nil && st.Start.State == node.StateReady {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("the service was not ready within 120 s: %v, %+v", err, st.Start)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stop signals s and waits for it to exit, at most 60 s.
func (s *serveChild) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("strata serve did not exit within 60 s of %v; log:\n%s", sig, s.log.String())
	}
	if sig == syscall.SIGTERM && s.err != nil {
		t.Fatalf("strata serve exited with %v after SIGTERM; log:\n%s", s.err, s.log.String())
	}
}

// objBytes is what object key holds: size bytes derived from the key.
func objBytes(dst []byte, key string) {
	h := fnv.New64a()
	h.Write([]byte(key))
	x := h.Sum64() | 1
	for i := 0; i < len(dst); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		for j := 0; j < 8 && i+j < len(dst); j++ {
			dst[i+j] = byte(x >> (8 * j))
		}
	}
}

func objSize(i int) int { return []int{1 << 10, 16 << 10, 64 << 10, 300 << 10, 3000}[i%5] }

// restartClient speaks to a node service that comes and goes: it reconnects
// (and registers its segment again) whenever a call fails.
type restartClient struct {
	t      testing.TB
	socket string
	name   string
	region *hostmem.Region
	conn   *wire.Conn
	seg    uint32
	id     uint64
	hello  *wire.HelloReply
	scr    []byte // scratch for checking what a get read
}

const clientSegment = 8 << 20

func newRestartClient(t testing.TB, socket, name string) *restartClient {
	al, err := hostmem.New(hostmem.Config{Kind: hostmem.Shm})
	if err != nil {
		t.Fatal(err)
	}
	r, err := al.Allocate(name, clientSegment)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	c := &restartClient{t: t, socket: socket, name: name, region: r, scr: make([]byte, 1<<20)}
	t.Cleanup(c.drop)
	return c
}

func (c *restartClient) drop() {
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn = nil
	}
}

// call sends one request on the current connection, connecting first.
func (c *restartClient) call(typ wire.Type, msg wire.Message) (wire.Message, error) {
	if c.conn == nil {
		if err := c.connect(); err != nil {
			return nil, err
		}
	}
	m, err := c.roundTrip(typ, msg)
	if err != nil {
		c.drop()
	}
	return m, err
}

func (c *restartClient) roundTrip(typ wire.Type, msg wire.Message, fds ...int) (wire.Message, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c.id++
	if err := c.conn.Send(ctx, typ, c.id, msg, fds...); err != nil {
		return nil, err
	}
	h, m, _, err := c.conn.Recv(ctx)
	if err != nil {
		return nil, err
	}
	if h.ID != c.id {
		return nil, fmt.Errorf("reply %d to request %d", h.ID, c.id)
	}
	if e, ok := m.(*wire.Error); ok {
		return nil, e.Err()
	}
	return m, nil
}

func (c *restartClient) connect() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := wire.Dial(ctx, c.socket)
	if err != nil {
		return err
	}
	c.conn = conn
	m, err := c.roundTrip(wire.TypeHello, wire.Hello{Version: wire.Version, ClientName: c.name})
	if err == nil {
		c.hello = m.(*wire.HelloReply)
		m, err = c.roundTrip(wire.TypeRegisterSegment, wire.RegisterSegment{Size: clientSegment, Name: "kv"}, c.region.Fd())
	}
	if err != nil {
		c.drop()
		return err
	}
	c.seg = m.(*wire.RegisterSegmentReply).SegmentID
	return nil
}

// put stores keys (sizes from objSize of their index) in one batch and
// returns the keys the service acknowledged.
func (c *restartClient) put(keys []string, sizes []int) ([]string, error) {
	mem := c.region.Bytes()
	if c.conn == nil {
		if err := c.connect(); err != nil {
			return nil, err
		}
	}
	items := make([]wire.Item, len(keys))
	off := 0
	for i, k := range keys {
		objBytes(mem[off:off+sizes[i]], k)
		items[i] = wire.Item{Key: k, Format: 3, Ranges: []wire.Range{{Segment: c.seg, Offset: uint64(off), Length: uint64(sizes[i])}}}
		off += sizes[i]
	}
	m, err := c.call(wire.TypePut, wire.Put{Items: items})
	if err != nil {
		return nil, err
	}
	var acked []string
	for i, r := range m.(*wire.BatchReply).Results {
		if r.Status == wire.OK {
			acked = append(acked, keys[i])
		}
	}
	return acked, nil
}

// get reads keys in one batch and reports which were found; a found object
// whose bytes are not its key's is an error.
func (c *restartClient) get(keys []string, sizes []int) (found []bool, wrong []string, err error) {
	mem := c.region.Bytes()
	if c.conn == nil {
		if err := c.connect(); err != nil {
			return nil, nil, err
		}
	}
	items := make([]wire.Item, len(keys))
	off := 0
	for i, k := range keys {
		clear(mem[off : off+sizes[i]])
		items[i] = wire.Item{Key: k, Format: 3, Ranges: []wire.Range{{Segment: c.seg, Offset: uint64(off), Length: uint64(sizes[i])}}}
		off += sizes[i]
	}
	m, err := c.call(wire.TypeGet, wire.Get{Items: items})
	if err != nil {
		return nil, nil, err
	}
	found = make([]bool, len(keys))
	off = 0
	for i, r := range m.(*wire.BatchReply).Results {
		if r.Status == wire.OK {
			found[i] = true
			want := c.scr[:sizes[i]]
			objBytes(want, keys[i])
			if !bytes.Equal(mem[off:off+sizes[i]], want) {
				wrong = append(wrong, keys[i])
			}
		}
		off += sizes[i]
	}
	return found, wrong, nil
}

// loadClient puts batches of new objects and reads back earlier ones until
// stopped, through restarts of the service, counting what it saw.
type loadClient struct {
	*restartClient
	mu      sync.Mutex
	acked   map[string]int // acknowledged puts: key → size
	sent    map[string]int // every key ever sent
	wrong   []string
	errs    atomic.Int64
	batches atomic.Int64
}

func newLoadClient(t *testing.T, socket, name string) *loadClient {
	return &loadClient{restartClient: newRestartClient(t, socket, name), acked: map[string]int{}, sent: map[string]int{}}
}

// run puts and gets until stop closes.
func (l *loadClient) run(stop <-chan struct{}) {
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		var keys []string
		var sizes []int
		for i := range 6 {
			k := fmt.Sprintf("%s/%06d/%d", l.name, n, i)
			keys = append(keys, k)
			sizes = append(sizes, objSize(n+i))
		}
		l.mu.Lock()
		for i, k := range keys {
			l.sent[k] = sizes[i]
		}
		l.mu.Unlock()
		acked, err := l.put(keys, sizes)
		if err != nil {
			l.errs.Add(1)
			time.Sleep(5 * time.Millisecond) // the service restarts: retry soon
			continue
		}
		l.mu.Lock()
		for _, k := range acked {
			l.acked[k] = l.sent[k]
		}
		// Read back a few acknowledged objects, old and new.
		var gk []string
		var gs []int
		for k, s := range l.acked { // from a random place: map order
			if gk, gs = append(gk, k), append(gs, s); len(gk) == 4 {
				break
			}
		}
		l.mu.Unlock()
		if len(gk) > 0 {
			_, wrong, err := l.get(gk, gs)
			if err != nil {
				l.errs.Add(1)
				continue
			}
			l.mu.Lock()
			l.wrong = append(l.wrong, wrong...)
			l.mu.Unlock()
		}
		l.batches.Add(1)
	}
}

// verify reads back every key the client ever sent: acknowledged ones must be
// found (unless lost, which the caller accounts for), and nothing found may
// hold wrong bytes. It returns how many acknowledged objects were missing.
func (l *loadClient) verify(t *testing.T) (missing int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var keys []string
	for k := range l.sent {
		keys = append(keys, k)
	}
	for len(keys) > 0 {
		var batch []string
		var sizes []int
		total := 0
		for len(keys) > 0 && len(batch) < 64 && total+l.sent[keys[0]] <= clientSegment {
			batch = append(batch, keys[0])
			sizes = append(sizes, l.sent[keys[0]])
			total += l.sent[keys[0]]
			keys = keys[1:]
		}
		var found []bool
		var wrong []string
		var err error
		for try := 0; try < 50; try++ {
			if found, wrong, err = l.get(batch, sizes); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("%s: reading back: %v", l.name, err)
		}
		for _, k := range wrong {
			t.Errorf("%s: %s served with wrong bytes", l.name, k)
		}
		for i, k := range batch {
			if _, ok := l.acked[k]; ok && !found[i] {
				missing++
				if missing <= 5 {
					t.Logf("%s: acknowledged %s is not served", l.name, k)
				}
			}
		}
	}
	for _, k := range l.wrong {
		t.Errorf("%s: %s was served with wrong bytes during the run", l.name, k)
	}
	return missing
}

// runLoad starts n load clients and returns them and a function that stops
// them and waits.
func runLoad(t *testing.T, socket string, n int) ([]*loadClient, func()) {
	var cs []*loadClient
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		c := newLoadClient(t, socket, fmt.Sprintf("client%d", i))
		cs = append(cs, c)
		wg.Go(func() { c.run(stop) })
	}
	var once sync.Once
	end := func() { once.Do(func() { close(stop); wg.Wait() }) }
	t.Cleanup(end)
	return cs, end
}

// waitAcked waits until the clients have at least n acknowledged objects in
// all since they were last counted.
func waitAcked(t *testing.T, cs []*loadClient, n int) {
	t.Helper()
	deadline := time.Now().Add(120 * time.Second)
	start := totalAcked(cs)
	for totalAcked(cs)-start < n {
		if time.Now().After(deadline) {
			t.Fatalf("the clients got %d puts acknowledged in 120 s, want %d", totalAcked(cs)-start, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func totalAcked(cs []*loadClient) int {
	n := 0
	for _, c := range cs {
		c.mu.Lock()
		n += len(c.acked)
		c.mu.Unlock()
	}
	return n
}

// SIGKILL while 4 clients put: the restarted service, on the same arena file,
// serves every acknowledged object with its bytes, never a torn one, and says
// it recovered them.
func TestServeKilledDuringPutsComesBackWarm(t *testing.T) {
	dir := shmArenaDir(t, 512<<20)
	socket := filepath.Join(shortDir(t), "s")
	args := []string{"--arena", "256MiB", "--arena-file", filepath.Join(dir, "a")}
	s := startServeOn(t, socket, args...)
	first := waitReady(t, socket)
	cs, stop := runLoad(t, socket, 4)
	waitAcked(t, cs, 400)
	s.stop(t, syscall.SIGKILL) // with puts in flight
	stop()

	s = startServeOn(t, socket, args...)
	st := waitReady(t, socket)
	acked := totalAcked(cs)
	// Objects committed in the moments before the kill that the arena had
	// not sealed yet are dropped, counted and logged (node/arena's seal.go):
	// every other acknowledged object is served.
	if !st.Start.Warm || st.Start.PreviousClean || st.Start.Restarts != 1 || st.Start.Lost != 0 ||
		st.Start.Recovered+st.Start.Unsealed < int64(acked) || st.Start.ContentID != first.Start.ContentID {
		t.Fatalf("after a SIGKILL: %+v, %d objects acknowledged", st.Start, acked)
	}
	if st.Start.Unsealed > 0 && !strings.Contains(s.log.String(), "not sealed yet") {
		t.Errorf("%d unsealed objects dropped and not logged:\n%s", st.Start.Unsealed, s.log.String())
	}
	missing := 0
	for _, c := range cs {
		missing += c.verify(t)
		if c.hello == nil || c.hello.ContentID != first.Start.ContentID || !c.hello.Warm {
			t.Errorf("%s: HelloReply after the restart %+v: want the same content id, warm", c.name, c.hello)
		}
	}
	if int64(missing) > st.Start.Unsealed {
		t.Errorf("%d acknowledged objects are not served after the restart; %d reported unsealed", missing, st.Start.Unsealed)
	}
	t.Logf("%d acknowledged objects back after SIGKILL; start: %+v", acked, st.Start)
	if !strings.Contains(s.log.String(), "arena recovered") {
		t.Fatalf("no recovery in the log:\n%s", s.log.String())
	}
}

// SIGKILL while the arena evicts to the spill: every acknowledged object is
// served afterwards from the arena or the spill, with its bytes.
func TestServeKilledDuringEvictionToTheSpill(t *testing.T) {
	dir := shmArenaDir(t, 128<<20)
	socket := filepath.Join(shortDir(t), "s")
	spillDir := t.TempDir()
	args := []string{"--arena", "32MiB", "--arena-file", filepath.Join(dir, "a"), "--spill-dir", spillDir}
	s := startServeOn(t, socket, args...)
	waitReady(t, socket)
	cs, stop := runLoad(t, socket, 2)
	// Well past the arena's size: evictions run all along.
	deadline := time.Now().Add(120 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, _, err := fetchStats(ctx, socket)
		cancel()
		if err == nil && st.Arena.Evictions > 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no evictions within 120 s: %v %+v", err, st.Arena)
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.stop(t, syscall.SIGKILL)
	stop()

	s = startServeOn(t, socket, args...)
	st := waitReady(t, socket)
	t.Logf("%d objects acknowledged before the SIGKILL", totalAcked(cs))
	if !st.Start.Warm || st.Start.Lost != 0 || st.Start.Recovered == 0 || st.Start.EvictionsChecked == 0 {
		t.Fatalf("after a SIGKILL during evictions: %+v", st.Start)
	}
	// Objects the spill still held in its write buffers died with the
	// process: they must be counted and logged, every other one served.
	missing := 0
	for _, c := range cs {
		missing += c.verify(t)
	}
	if int64(missing) > st.Start.LostEvicted+st.Start.Unsealed {
		t.Errorf("%d acknowledged objects are in neither tier after the restart; the service reported %d lost and %d unsealed",
			missing, st.Start.LostEvicted, st.Start.Unsealed)
	}
	if st.Start.LostEvicted > 0 && !strings.Contains(s.log.String(), "still in the spill's write buffers") {
		t.Errorf("%d objects lost and not logged:\n%s", st.Start.LostEvicted, s.log.String())
	}
	st = waitReady(t, socket)
	t.Logf("after the restart: %d objects recovered in the arena, %d spill hits, %d in the spill, %d acknowledged missing, %d reported lost of %d evictions checked",
		st.Start.Recovered, st.Ops.SpillHits, st.Spill.Objects, missing, st.Start.LostEvicted, st.Start.EvictionsChecked)
	if st.Ops.SpillHits == 0 {
		t.Fatal("no object was read from the spill: the test did not evict")
	}
}

// SIGTERM under load: the service exits cleanly within the shutdown timeout
// (in-flight requests finish or fail), flushes the spill, marks the arena
// clean, and the next one serves every acknowledged object.
func TestServeStoppedUnderLoadComesBackClean(t *testing.T) {
	dir := shmArenaDir(t, 256<<20)
	socket := filepath.Join(shortDir(t), "s")
	spillDir := t.TempDir()
	args := []string{"--arena", "64MiB", "--arena-file", filepath.Join(dir, "a"), "--spill-dir", spillDir, "--shutdown-timeout", "5s"}
	s := startServeOn(t, socket, args...)
	cs, stop := runLoad(t, socket, 4)
	waitAcked(t, cs, 300)
	start := time.Now()
	s.stop(t, syscall.SIGTERM) // under load; fails the test on a nonzero exit
	took := time.Since(start)
	stop()
	if !strings.Contains(s.log.String(), "shutting down") {
		t.Fatalf("no shutdown in the log:\n%s", s.log.String())
	}
	t.Logf("SIGTERM under load: exited after %v", took)

	startServeOn(t, socket, args...)
	st := waitReady(t, socket)
	if !st.Start.Warm || !st.Start.PreviousClean || st.Start.Lost != 0 {
		t.Fatalf("after SIGTERM: %+v", st.Start)
	}
	for _, c := range cs {
		if missing := c.verify(t); missing > 0 {
			t.Errorf("%s: %d acknowledged objects are not served after SIGTERM and a restart", c.name, missing)
		}
	}
	t.Logf("%d acknowledged objects back after SIGTERM under load and a restart; start %+v", totalAcked(cs), st.Start)
}

// A restart with another --arena cannot reuse the file: it says so in one log
// line, starts empty (a new content id, which clients see), and never serves
// the old bytes.
func TestServeOnAnArenaFileOfAnotherSize(t *testing.T) {
	dir := shmArenaDir(t, 256<<20)
	socket := filepath.Join(shortDir(t), "s")
	file := filepath.Join(dir, "a")
	s := startServeOn(t, socket, "--arena", "32MiB", "--arena-file", file)
	before := waitReady(t, socket)
	c := newRestartClient(t, socket, "c")
	keys := []string{"k/1", "k/2", "k/3"}
	sizes := []int{1000, 70000, 5000}
	if acked, err := c.put(keys, sizes); err != nil || len(acked) != 3 {
		t.Fatalf("put: %v, %d acknowledged", err, len(acked))
	}
	s.stop(t, syscall.SIGTERM)
	c.drop()

	s = startServeOn(t, socket, "--arena", "48MiB", "--arena-file", file)
	st := waitReady(t, socket)
	if st.Start.Warm || !strings.Contains(st.Start.ColdReason, "32.0 MiB") || st.Start.DroppedAtStart != 3 || st.Start.ContentID == before.Start.ContentID {
		t.Fatalf("on a file of another size: %+v", st.Start)
	}
	if n := strings.Count(s.log.String(), "arena file starts empty"); n != 1 {
		t.Fatalf("%d lines saying the arena file starts empty, want 1; log:\n%s", n, s.log.String())
	}
	found, wrong, err := c.get(keys, sizes)
	if err != nil || len(wrong) > 0 || found[0] || found[1] || found[2] {
		t.Fatalf("get after the cold start: %v, found %v, wrong %v", err, found, wrong)
	}
	if c.hello.Warm || c.hello.ContentID == before.Start.ContentID {
		t.Fatalf("HelloReply after the cold start: %+v", c.hello)
	}
	var out bytes.Buffer
	if err := writeInspect(&out, st); err != nil || !strings.Contains(out.String(), "started empty") {
		t.Fatalf("inspect: %v\n%s", err, out.String())
	}
}

// A damaged arena file (random bytes, truncated) never crashes the service
// and never serves wrong bytes.
func TestServeOnADamagedArenaFile(t *testing.T) {
	dir := shmArenaDir(t, 256<<20)
	for _, damage := range []string{"random", "truncated", "random-tail"} {
		t.Run(damage, func(t *testing.T) {
			socket := filepath.Join(shortDir(t), "s")
			file := filepath.Join(dir, damage)
			args := []string{"--arena", "32MiB", "--arena-file", file}
			s := startServeOn(t, socket, args...)
			c := newRestartClient(t, socket, "c")
			var keys []string
			var sizes []int
			for i := range 40 {
				keys, sizes = append(keys, fmt.Sprint("d/", i)), append(sizes, objSize(i))
			}
			if acked, err := c.put(keys, sizes); err != nil || len(acked) != len(keys) {
				t.Fatalf("put: %v, %d acknowledged", err, len(acked))
			}
			s.stop(t, syscall.SIGKILL)
			c.drop()
			f, err := os.OpenFile(file, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			fi, _ := f.Stat()
			rng := rand.New(rand.NewPCG(3, 4))
			junk := make([]byte, 1<<20)
			for i := range junk {
				junk[i] = byte(rng.Uint32())
			}
			switch damage {
			case "random":
				for off := int64(0); off < fi.Size(); off += int64(len(junk)) {
					_, _ = f.WriteAt(junk, off)
				}
			case "truncated":
				_ = f.Truncate(fi.Size() / 3)
			case "random-tail":
				// The header and the first objects survive; the rest is junk.
				for off := fi.Size() / 2; off < fi.Size(); off += int64(len(junk)) {
					_, _ = f.WriteAt(junk, off)
				}
			}
			f.Close()
			s = startServeOn(t, socket, args...)
			st := waitReady(t, socket)
			found, wrong, err := c.get(keys, sizes)
			if err != nil {
				t.Fatal(err)
			}
			if len(wrong) > 0 {
				t.Fatalf("served with wrong bytes from a %s arena file: %v", damage, wrong)
			}
			n := 0
			for _, f := range found {
				if f {
					n++
				}
			}
			t.Logf("%s: %d of %d objects served, start %+v", damage, n, len(keys), st.Start)
			// And it works.
			if acked, err := c.put([]string{"after"}, []int{5000}); err != nil || len(acked) != 1 {
				t.Fatalf("put after the restart: %v", err)
			}
			select {
			case <-s.exited:
				t.Fatalf("the service exited: %v\n%s", s.err, s.log.String())
			default:
			}
		})
	}
}

// Two services on one arena file: the second is refused, naming the first.
func TestServeTwoOnOneArenaFile(t *testing.T) {
	dir := shmArenaDir(t, 64<<20)
	file := filepath.Join(dir, "a")
	first := startServeOn(t, filepath.Join(shortDir(t), "s"), "--arena", "16MiB", "--arena-file", file)
	second := spawnServe(t, filepath.Join(shortDir(t), "s"), "--arena", "16MiB", "--arena-file", file)
	select {
	case <-second.exited:
	case <-time.After(60 * time.Second):
		t.Fatal("a second service on the arena file did not exit")
	}
	var ee *exec.ExitError
	if !errors.As(second.err, &ee) || ee.ExitCode() == 0 ||
		!strings.Contains(second.log.String(), fmt.Sprintf("in use by another node service (pid %d)", first.cmd.Process.Pid)) {
		t.Fatalf("second service: %v; log:\n%s", second.err, second.log.String())
	}
}

// A rolling restart: 4 clients keep putting and getting, verifying every byte
// they read, while the service is restarted again and again on its arena file
// (SIGTERM, and SIGKILL every other time). At the end every acknowledged
// object is served, or reported lost by the service: 0 wrong bytes.
func TestServeRollingRestart(t *testing.T) {
	dir := shmArenaDir(t, 512<<20)
	socket := filepath.Join(shortDir(t), "s")
	args := []string{"--arena", "256MiB", "--arena-file", filepath.Join(dir, "a"), "--shutdown-timeout", "5s"}
	s := startServeOn(t, socket, args...)
	cs, stop := runLoad(t, socket, 4)
	var lost int64
	const restarts = 6
	for i := range restarts {
		waitAcked(t, cs, 60)
		sig := syscall.SIGTERM
		if i%2 == 1 {
			sig = syscall.SIGKILL
		}
		s.stop(t, sig)
		s = startServeOn(t, socket, args...)
		st := waitReady(t, socket)
		if !st.Start.Warm || st.Start.Restarts != uint64(i+1) {
			t.Fatalf("restart %d (%v): %+v", i+1, sig, st.Start)
		}
		lost += st.Start.Lost + st.Start.LostEvicted + st.Start.Unsealed
	}
	waitAcked(t, cs, 60)
	stop()
	missing := 0
	for _, c := range cs {
		missing += c.verify(t)
	}
	t.Logf("%d restarts, %d objects acknowledged, %d batches, %d failed calls during restarts, %d missing, %d reported lost",
		restarts, totalAcked(cs), cs[0].batches.Load()+cs[1].batches.Load()+cs[2].batches.Load()+cs[3].batches.Load(),
		cs[0].errs.Load()+cs[1].errs.Load()+cs[2].errs.Load()+cs[3].errs.Load(), missing, lost)
	if int64(missing) > lost {
		t.Fatalf("%d acknowledged objects are not served, the service reported %d lost", missing, lost)
	}
}

// The text output says how the start went: starting (how far) or ready, and
// what the service kept of the one before.
func TestInspectTextShowsTheStart(t *testing.T) {
	for _, c := range []struct {
		start node.StartStats
		want  []string
	}{
		{node.StartStats{State: node.StateStarting, Message: "starting (37% of the arena ready)", ListeningAfter: 3 * time.Millisecond},
			[]string{"start   starting (37% of the arena ready), serving what is ready (listening after 3ms)", "anonymous arena"}},
		{node.StartStats{State: node.StateReady, ReadyAfter: 412 * time.Millisecond, Warm: true, ArenaFile: "/run/strata/strata.arena",
			Restarts: 3, Recovered: 12345, Lost: 2},
			[]string{"ready after 412ms", "restart 3 on arena file /run/strata/strata.arena (the service before killed or crashed): 12345 objects recovered, 2 lost"}},
		{node.StartStats{State: node.StateReady, Warm: true, PreviousClean: true, ArenaFile: "f", LostEvicted: 4},
			[]string{"shut down cleanly", "4 evicted to the spill and lost with its write buffers"}},
		{node.StartStats{State: node.StateReady, Warm: true, ArenaFile: "f", Unsealed: 3},
			[]string{"killed or crashed", "3 put just before the kill and dropped unsealed"}},
		{node.StartStats{State: node.StateReady, ArenaFile: "f", ColdReason: "it holds an arena of 32.0 MiB", DroppedAtStart: 9},
			[]string{"arena file f started empty: it holds an arena of 32.0 MiB (9 objects dropped)"}},
	} {
		var b bytes.Buffer
		if err := writeInspect(&b, node.Stats{Start: c.start}); err != nil {
			t.Fatal(err)
		}
		for _, w := range c.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("inspect of %+v lacks %q:\n%s", c.start, w, b.String())
			}
		}
	}
}
