package node

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node/wire"
)

// The soak test runs the service for a while against many honest clients, some
// of them separate processes that are killed with SIGKILL at random, and one
// hostile client that loops through the attacks of issue 11. Every byte an
// honest client reads back is checked against what was put. At the end the
// service's descriptors must be back near where they started, its memory
// bounded, and a fresh client served.
//
//	STRATA_SOAK=60s go test -race -run '^TestSoak$' -v ./node
//
// The environment variables below make the test binary a client process.
const (
	soakClientEnv = "STRATA_SOAK_CLIENT"      // the socket to connect to
	soakNameEnv   = "STRATA_SOAK_CLIENT_NAME" // the client's name (its key prefix)
)

const (
	soakClients   = 32 // honest clients
	soakProcesses = 4  // of which separate processes, killed at random
	soakBatch     = 8  // objects per put
	soakMaxObject = 32 << 10
	soakFormat    = 7
)

// soakDuration is how long the clients run: STRATA_SOAK when set, 60 s under
// CI, 10 s otherwise.
func soakDuration(t *testing.T) time.Duration {
	if v := os.Getenv("STRATA_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("STRATA_SOAK=%q: want a positive duration such as 60s", v)
		}
		return d
	}
	if os.Getenv("CI") == "true" {
		return 60 * time.Second
	}
	return 10 * time.Second
}

// soakPattern fills b with the bytes of key's object: a stream seeded by the
// key, so that any reader can check an object without knowing who put it.
func soakPattern(b []byte, key string) {
	h := fnv.New64a()
	h.Write([]byte(key))
	x := h.Sum64()
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		binary.LittleEndian.PutUint64(w[:], z)
		copy(b[i:], w[:])
	}
}

// soakSize is the size of key's object: 4 to 32 KiB, from the key.
func soakSize(key string) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return 4096 * (1 + int(h.Sum32()%8))
}

// soakConn is a client speaking the protocol by hand; unlike rawClient it
// never touches a testing.T, so it runs on any goroutine and in child processes.
type soakConn struct {
	conn *wire.Conn
	id   uint64
}

func soakDial(socket, name string) (*soakConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := wire.Dial(ctx, socket)
	if err != nil {
		return nil, err
	}
	c := &soakConn{conn: conn}
	if _, err := c.call(wire.TypeHello, wire.Hello{Version: wire.Version, ClientName: name}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("hello: %w", err)
	}
	return c, nil
}

// soakRequestTimeout bounds one request of a soak client: generous, since a
// request may wait RequestTimeout for the memory budget and as long again to be
// handled, on a machine that the soak itself keeps busy.
const soakRequestTimeout = 2 * time.Minute

func (c *soakConn) send(t wire.Type, msg wire.Message, fds ...int) (uint64, error) {
	c.id++
	ctx, cancel := context.WithTimeout(context.Background(), soakRequestTimeout)
	defer cancel()
	return c.id, c.conn.Send(ctx, t, c.id, msg, fds...)
}

func (c *soakConn) recv(id uint64) (wire.Message, error) {
	ctx, cancel := context.WithTimeout(context.Background(), soakRequestTimeout)
	defer cancel()
	h, m, fds, err := c.conn.Recv(ctx)
	for _, fd := range fds {
		unix.Close(fd)
	}
	if err != nil {
		return nil, err
	}
	if h.ID != id {
		return nil, fmt.Errorf("reply to request %d, want %d", h.ID, id)
	}
	if e, ok := m.(*wire.Error); ok {
		return nil, e.Err()
	}
	return m, nil
}

func (c *soakConn) call(t wire.Type, msg wire.Message, fds ...int) (wire.Message, error) {
	id, err := c.send(t, msg, fds...)
	if err != nil {
		return nil, err
	}
	return c.recv(id)
}

func (c *soakConn) batch(t wire.Type, items []wire.Item) ([]wire.Result, error) {
	var msg wire.Message = wire.Put{Items: items}
	if t == wire.TypeGet {
		msg = wire.Get{Items: items}
	}
	m, err := c.call(t, msg)
	if err != nil {
		return nil, err
	}
	br, ok := m.(*wire.BatchReply)
	if !ok || len(br.Results) != len(items) {
		return nil, fmt.Errorf("%s of %d items answered %T %+v", t, len(items), m, m)
	}
	return br.Results, nil
}

func (c *soakConn) register(fd int, size int, name string) (uint32, error) {
	m, err := c.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: uint64(size), Name: name}, fd)
	if err != nil {
		return 0, err
	}
	return m.(*wire.RegisterSegmentReply).SegmentID, nil
}

// soakStats is what one client did.
type soakStats struct {
	ops, corrupt, miss, busy atomic.Int64
	// slowest is the longest batch request, in nanoseconds.
	slowest atomic.Int64
}

// timed runs a request and keeps its time if it is the slowest yet.
func (s *soakStats) timed(f func()) {
	t0 := time.Now()
	f()
	d := int64(time.Since(t0))
	for cur := s.slowest.Load(); d > cur && !s.slowest.CompareAndSwap(cur, d); cur = s.slowest.Load() {
	}
}

func (s *soakStats) String() string {
	return fmt.Sprintf("ops %d corrupt %d miss %d busy %d", s.ops.Load(), s.corrupt.Load(), s.miss.Load(), s.busy.Load())
}

// soakHonest puts batches of objects and reads them back (with a few older
// ones), checking every byte, until stop is closed. progress runs after each
// round. It returns the first thing a well-behaved client must never see.
func soakHonest(stop <-chan struct{}, socket, name string, st *soakStats, progress func()) error {
	c, err := soakDial(socket, name)
	if err != nil {
		return err
	}
	defer c.conn.Close()
	a, err := hostmem.New(hostmem.Config{Kind: hostmem.Shm})
	if err != nil {
		return err
	}
	const half = soakBatch * soakMaxObject
	region, err := a.Allocate("soak", 2*half)
	if err != nil {
		return err
	}
	defer region.Close()
	mem := region.Bytes()
	seg, err := c.register(region.Fd(), int(region.Size()), "kv")
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), fnvString(name)))
	want := make([]byte, soakMaxObject)
	key := func(round, i int) string { return fmt.Sprintf("soak/%s/%d/%d", name, round, i) }
	for round := 0; ; round++ {
		select {
		case <-stop:
			return nil
		default:
		}
		puts := make([]wire.Item, soakBatch)
		off := 0
		for i := range puts {
			k := key(round, i)
			n := soakSize(k)
			soakPattern(mem[off:off+n], k)
			puts[i] = wire.Item{Key: k, Format: soakFormat, Ranges: []wire.Range{{Segment: seg, Offset: uint64(off), Length: uint64(n)}}}
			off += n
		}
		var res []wire.Result
		var err error
		st.timed(func() { res, err = c.batch(wire.TypePut, puts) })
		if err != nil {
			return fmt.Errorf("round %d put: %w", round, err)
		}
		for i, r := range res {
			switch r.Status {
			case wire.OK:
				st.ops.Add(1)
			case wire.Busy, wire.NoSpace:
				st.busy.Add(1)
			default:
				return fmt.Errorf("round %d put %q: %v %s", round, puts[i].Key, r.Status, r.Message)
			}
		}
		// Read this round's objects back, and two of earlier rounds (which may
		// have gone to the spill, or out of it).
		var keys []string
		for i := range soakBatch - 2 {
			keys = append(keys, key(round, i))
		}
		for range 2 {
			keys = append(keys, key(rng.IntN(round+1), rng.IntN(soakBatch)))
		}
		gets := make([]wire.Item, len(keys))
		off = half
		for i, k := range keys {
			n := soakSize(k)
			for j := range mem[off : off+n] {
				mem[off+j] = 0xa5 // a get that answers ok without writing is caught
			}
			gets[i] = wire.Item{Key: k, Format: soakFormat, Ranges: []wire.Range{{Segment: seg, Offset: uint64(off), Length: uint64(n)}}}
			off += n
		}
		if st.timed(func() { res, err = c.batch(wire.TypeGet, gets) }); err != nil {
			return fmt.Errorf("round %d get: %w", round, err)
		}
		for i, r := range res {
			switch r.Status {
			case wire.OK:
				n, o := int(gets[i].Ranges[0].Length), int(gets[i].Ranges[0].Offset)
				soakPattern(want[:n], keys[i])
				if string(want[:n]) != string(mem[o:o+n]) {
					st.corrupt.Add(1)
				} else {
					st.ops.Add(1)
				}
			case wire.NotFound:
				st.miss.Add(1)
			case wire.Busy:
				st.busy.Add(1)
			default:
				return fmt.Errorf("round %d get %q: %v %s", round, keys[i], r.Status, r.Message)
			}
		}
		progress()
	}
}

func fnvString(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// soakChild is the test binary run as a client process: it works until its
// stdin closes (or it is killed), printing its totals after every round.
func soakChild(t *testing.T, socket string) {
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	var st soakStats
	report := func() {
		fmt.Printf("soakstat %d %d %d %d %d\n", st.ops.Load(), st.corrupt.Load(), st.miss.Load(), st.busy.Load(), st.slowest.Load())
	}
	err := soakHonest(stop, socket, os.Getenv(soakNameEnv), &st, report)
	report()
	if err != nil {
		fmt.Printf("soakerr %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		t.Fatal(err)
	}
	<-stop
}

// soakProc is one incarnation of a client process.
type soakProc struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	st     soakStats
	done   chan struct{} // its stdout reached EOF
	mu     sync.Mutex
	errs   []string
	stderr lockedBuffer
}

func startSoakProc(socket, name string) (*soakProc, error) {
	p := &soakProc{name: name, done: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], "-test.run=^TestSoak$", "-test.count=1")
	p.cmd.Env = append(os.Environ(), soakClientEnv+"="+socket, soakNameEnv+"="+name)
	p.cmd.Stderr = &p.stderr
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "soakstat "):
				f := strings.Fields(line)
				if len(f) != 6 {
					continue
				}
				for i, c := range []*atomic.Int64{&p.st.ops, &p.st.corrupt, &p.st.miss, &p.st.busy, &p.st.slowest} {
					if v, err := strconv.ParseInt(f[i+1], 10, 64); err == nil {
						c.Store(v)
					}
				}
			case strings.HasPrefix(line, "soakerr "):
				p.mu.Lock()
				p.errs = append(p.errs, strings.TrimPrefix(line, "soakerr "))
				p.mu.Unlock()
			}
		}
	}()
	return p, nil
}

// kill ends the process with SIGKILL and waits for it.
func (p *soakProc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
	_ = p.cmd.Wait()
	_ = p.stdin.Close()
}

// finish asks the process to stop (EOF on its stdin) and waits for it.
func (p *soakProc) finish() error {
	_ = p.stdin.Close()
	timer := time.AfterFunc(2*time.Minute, func() { _ = p.cmd.Process.Kill() })
	defer timer.Stop()
	<-p.done
	err := p.cmd.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil || len(p.errs) > 0 {
		return fmt.Errorf("client process %s: %v %v\n%s", p.name, err, p.errs, p.stderr.b.String())
	}
	return nil
}

// soakHostile loops through the attacks of issue 11 until stop is closed.
type soakHostile struct {
	socket string
	huge   []wire.Item // the huge Get's items, built once
	// spent is the time each attack took, over all rounds (for the log).
	spent, longest map[string]time.Duration
	st             soakStats
	rounds         atomic.Int64
	errs           []error // written by the hostile goroutine only, read after done
	done           chan struct{}
}

func (h *soakHostile) run(stop <-chan struct{}) {
	defer close(h.done)
	for {
		select {
		case <-stop:
			return
		default:
		}
		if err := h.round(int(h.rounds.Load())); err != nil {
			h.errs = append(h.errs, fmt.Errorf("hostile round %d: %w", h.rounds.Load(), err))
			return
		}
		h.rounds.Add(1)
	}
}

// soakUnsealed makes a memfd like SGLang's host pools: never sealed, sized with
// ftruncate (so sparse), mapped shared.
func soakUnsealed(size int) (int, []byte, error) {
	fd, err := unix.MemfdCreate("soak_hostile", unix.MFD_CLOEXEC)
	if err != nil {
		return -1, nil, err
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return -1, nil, err
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return -1, nil, err
	}
	return fd, mem, nil
}

func (h *soakHostile) round(n int) (err error) {
	step, stepName := time.Now(), "idle connections"
	mark := func(next string) {
		d := time.Since(step)
		h.spent[stepName] += d
		h.longest[stepName] = max(h.longest[stepName], d)
		step, stepName = time.Now(), next
	}
	defer mark("")
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()

	// 1. Connections that never say Hello, or send two bytes of a header.
	var idle []net.Conn
	for i := range 4 {
		raw, err := net.Dial("unix", h.socket)
		if err != nil {
			return fmt.Errorf("idle dial: %w", err)
		}
		cleanups = append(cleanups, func() { raw.Close() })
		if i%2 == 1 {
			_, _ = raw.Write([]byte("ST"))
		}
		idle = append(idle, raw)
	}

	c, err := soakDial(h.socket, "hostile")
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() { c.conn.Close() })
	a, err := hostmem.New(hostmem.Config{Kind: hostmem.Shm})
	if err != nil {
		return err
	}
	region, err := a.Allocate("hostile", 2<<20)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() { region.Close() })
	mem := region.Bytes()
	seg, err := c.register(region.Fd(), int(region.Size()), "kv")
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}

	mark("many registrations")
	// 2. Many registrations of one small memfd, past the per-client cap.
	many, err := soakDial(h.socket, "hostile-many")
	if err != nil {
		return err
	}
	small, err := a.Allocate("small", 4096)
	if err != nil {
		many.conn.Close()
		return err
	}
	ok := 0
	for range soakSegmentCap + 8 {
		if _, err := many.register(small.Fd(), 4096, "tiny"); err == nil {
			ok++
		} else if wire.StatusOf(err) != wire.Quota {
			many.conn.Close()
			small.Close()
			return fmt.Errorf("registration past the cap: %w", err)
		}
	}
	many.conn.Close()
	small.Close()
	if ok != soakSegmentCap-1 && ok != soakSegmentCap {
		return fmt.Errorf("%d of %d small registrations accepted, cap %d", ok, soakSegmentCap+8, soakSegmentCap)
	}
	h.st.ops.Add(1)

	mark("sparse memfd")
	// 3. A sparse memfd: registering it must allocate nothing.
	const sparseSize = 256 << 20
	sfd, smem, err := soakUnsealed(sparseSize)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() { unix.Munmap(smem); unix.Close(sfd) })
	sseg, err := c.register(sfd, sparseSize, "sparse")
	if err != nil {
		return fmt.Errorf("register sparse: %w", err)
	}
	var fst unix.Stat_t
	if err := unix.Fstat(sfd, &fst); err != nil {
		return err
	}
	if fst.Blocks != 0 {
		return fmt.Errorf("registering a sparse memfd of %d bytes allocated %d bytes", sparseSize, fst.Blocks*512)
	}

	mark("odd keys")
	// 4. Keys with '/' and spaces (and the longest key), put and read back.
	keys := []string{
		fmt.Sprintf("hostile/org/model name/%d/a b", n),
		fmt.Sprintf("hostile/../../%d/ spaced  key /", n),
		fmt.Sprintf("hostile/%d/%s", n, strings.Repeat("x/ ", 200))[:wire.MaxKey],
	}
	var puts, gets []wire.Item
	for i, k := range keys {
		soakPattern(mem[i*4096:(i+1)*4096], k)
		puts = append(puts, wire.Item{Key: k, Format: soakFormat, Ranges: []wire.Range{{Segment: seg, Offset: uint64(i * 4096), Length: 4096}}})
		// Read back into the sparse segment, far into it.
		gets = append(gets, wire.Item{Key: k, Format: soakFormat, Ranges: []wire.Range{{Segment: sseg, Offset: uint64(128<<20 + i*4096), Length: 4096}}})
	}
	stored, err := h.expect(c, wire.TypePut, puts, wire.OK)
	if err != nil {
		return err
	}
	want := make([]byte, 64<<10)
	for i, k := range keys {
		if !slices.ContainsFunc(stored, func(it wire.Item) bool { return it.Key == k }) {
			continue
		}
		if got, err := h.expect(c, wire.TypeGet, gets[i:i+1], wire.OK); err != nil {
			return err
		} else if len(got) == 0 {
			continue
		}
		soakPattern(want[:4096], k)
		if string(want[:4096]) != string(smem[128<<20+i*4096:128<<20+(i+1)*4096]) {
			h.st.corrupt.Add(1)
		}
	}

	mark("format mismatch")
	// 5. A put of an existing key in another format.
	fkey := fmt.Sprintf("hostile/fmt/%d", n)
	soakPattern(mem[:4096], fkey)
	put := wire.Item{Key: fkey, Format: soakFormat, Ranges: []wire.Range{{Segment: seg, Offset: 0, Length: 4096}}}
	if stored, err := h.expect(c, wire.TypePut, []wire.Item{put}, wire.OK); err != nil {
		return err
	} else if len(stored) == 1 {
		put.Format = soakFormat + 1
		if _, err := h.expect(c, wire.TypePut, []wire.Item{put}, wire.FormatMismatch); err != nil {
			return err
		}
	}

	mark("huge get")
	// 6. The largest Get the protocol allows: MaxItems items of MaxRanges
	// ranges. Every third round: encoding a million ranges takes seconds of a
	// core under the race detector, time the other attacks should have.
	if n%3 == 0 {
		if err := h.hugeGet(c, seg); err != nil {
			return err
		}
	}

	mark("truncated memfd")
	// 7. A put from an unsealed memfd that the client truncates while the
	// service copies from it. Items answer ok or a fault; an object that
	// answered ok holds exactly what was put.
	const tsize, tpart = 1 << 20, 64 << 10
	tfd, tmem, err := soakUnsealed(tsize)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() { unix.Munmap(tmem); unix.Close(tfd) })
	tseg, err := c.register(tfd, tsize, "truncated")
	if err != nil {
		return fmt.Errorf("register the memfd to truncate: %w", err)
	}
	var tputs []wire.Item
	for i := range tsize / tpart {
		k := fmt.Sprintf("hostile/trunc/%d/%d", n, i)
		soakPattern(tmem[i*tpart:(i+1)*tpart], k)
		tputs = append(tputs, wire.Item{Key: k, Format: soakFormat, Ranges: []wire.Range{{Segment: tseg, Offset: uint64(i * tpart), Length: tpart}}})
	}
	mark("truncated memfd: put")
	id, err := c.send(wire.TypePut, wire.Put{Items: tputs})
	if err != nil {
		return err
	}
	if err := unix.Ftruncate(tfd, tsize/4); err != nil {
		return err
	}
	mark("truncated memfd: put reply")
	m, err := c.recv(id)
	if err != nil {
		return fmt.Errorf("put from a memfd truncated mid-batch: %w", err)
	}
	stored = nil
	for i, r := range m.(*wire.BatchReply).Results {
		switch r.Status {
		case wire.OK:
			stored = append(stored, wire.Item{Key: tputs[i].Key, Format: soakFormat, Ranges: []wire.Range{{Segment: seg, Offset: uint64(len(stored) * tpart), Length: tpart}}})
		case wire.BadRange, wire.Busy, wire.NoSpace:
		default:
			return fmt.Errorf("put item %d from a truncated memfd: %v %s", i, r.Status, r.Message)
		}
	}
	mark("truncated memfd: get back")
	if len(stored) > 0 {
		got, err := h.expect(c, wire.TypeGet, stored, wire.OK)
		if err != nil {
			return err
		}
		for i, it := range stored {
			if !slices.ContainsFunc(got, func(g wire.Item) bool { return g.Key == it.Key }) {
				continue
			}
			soakPattern(want[:tpart], it.Key)
			if string(want[:tpart]) != string(mem[i*tpart:(i+1)*tpart]) {
				h.st.corrupt.Add(1)
			}
		}
	}

	mark("idle connections closed")
	// The connections of step 1 were closed by the service (Hello timeout).
	for i, raw := range idle {
		raw.SetReadDeadline(time.Now().Add(60 * time.Second))
		if _, err := io.Copy(io.Discard, raw); err != nil {
			return fmt.Errorf("idle connection %d was not closed by the service: %w", i, err)
		}
	}
	return nil
}

// expect runs a batch and checks every item answered want, returning the
// items that did. A put may also answer busy or no space under load, a get
// not found (counted, and left out of what it returns); anything else is an
// error.
func (h *soakHostile) expect(c *soakConn, t wire.Type, items []wire.Item, want wire.Status) ([]wire.Item, error) {
	res, err := c.batch(t, items)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", t, err)
	}
	var done []wire.Item
	for i, r := range res {
		switch {
		case r.Status == want:
			done = append(done, items[i])
		case t == wire.TypePut && (r.Status == wire.Busy || r.Status == wire.NoSpace):
			h.st.busy.Add(1)
		case t == wire.TypeGet && r.Status == wire.NotFound:
			// Honest clients write hundreds of MiB a minute: an object put
			// while the machine was slow may be out of the spill already.
			h.st.miss.Add(1)
		default:
			return nil, fmt.Errorf("%s %q: %v %s, want %v", t, items[i].Key, r.Status, r.Message, want)
		}
	}
	h.st.ops.Add(int64(len(done)))
	return done, nil
}

// hugeGet sends the largest Get there is, of keys that do not exist: each
// item misses, or the whole request is answered busy under the memory budget.
func (h *soakHostile) hugeGet(c *soakConn, seg uint32) error {
	if h.huge == nil {
		h.huge = make([]wire.Item, wire.MaxItems)
		ranges := make([]wire.Range, wire.MaxItems*wire.MaxRanges)
		for i := range h.huge {
			r := ranges[i*wire.MaxRanges : (i+1)*wire.MaxRanges]
			for j := range r {
				// Bytes of its own for every item: a Get's items must not overlap.
				r[j] = wire.Range{Offset: uint64(i*wire.MaxRanges + j), Length: 1}
			}
			h.huge[i] = wire.Item{Key: fmt.Sprintf("hostile/none/%d", i), Format: soakFormat, Ranges: r}
		}
	}
	items := h.huge
	for _, it := range items {
		for j := range it.Ranges {
			it.Ranges[j].Segment = seg
		}
	}
	res, err := c.batch(wire.TypeGet, items)
	if wire.StatusOf(err) == wire.Busy {
		h.st.busy.Add(1)
		return nil
	}
	if err != nil {
		return fmt.Errorf("huge get: %w", err)
	}
	for i, r := range res {
		if r.Status != wire.NotFound {
			return fmt.Errorf("huge get item %d: %v %s", i, r.Status, r.Message)
		}
	}
	h.st.ops.Add(1)
	return nil
}

// soakSegmentCap is the service's MaxSegmentsPerClient in the soak.
const soakSegmentCap = 16

// procStatus reads the service's resident memory (this process: the service
// runs in it) and counts its open descriptors.
func procStatus(t *testing.T) (rss int64, fds int) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			rss = kb << 10
		}
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return rss, len(ents)
}

func TestSoak(t *testing.T) {
	if socket := os.Getenv(soakClientEnv); socket != "" {
		soakChild(t, socket)
		return
	}
	if testing.Short() {
		t.Skip("the soak test runs for a while; not under -short")
	}
	dur := soakDuration(t)
	s := start(t, func(c *Config) {
		c.ArenaBytes = 64 << 20
		c.SpillDir = t.TempDir()
		c.SpillBytes = 256 << 20
		c.MaxSegmentsPerClient = soakSegmentCap
		// Short enough that the hostile's silent connections go within a
		// round.
		c.HelloTimeout = 2 * time.Second
		// The largest frame there is (the huge Get) took 25 s to arrive
		// under the race detector at load 15, past the 10 s default, and
		// the service rightly dropped it as a trickle: the soak is about
		// serving that request, so it gets as long as any request.
		c.FrameTimeout = soakRequestTimeout
	})
	rss0, fds0 := procStatus(t)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	t.Logf("soak for %v: %d honest clients (%d of them processes killed at random), one hostile; seed %d", dur, soakClients, soakProcesses, seed)

	stop := make(chan struct{})
	var stopOnce sync.Once
	stopAll := func() { stopOnce.Do(func() { close(stop) }) }

	// Goroutine clients.
	type goClient struct {
		name string
		st   soakStats
		err  error
		done chan struct{}
	}
	var gos []*goClient
	for i := range soakClients - soakProcesses {
		g := &goClient{name: fmt.Sprintf("g%d", i), done: make(chan struct{})}
		gos = append(gos, g)
		go func() {
			defer close(g.done)
			g.err = soakHonest(stop, s.Socket(), g.name, &g.st, func() {})
		}()
	}
	// The hostile client.
	hostile := &soakHostile{socket: s.Socket(), done: make(chan struct{}), spent: map[string]time.Duration{}, longest: map[string]time.Duration{}}
	go hostile.run(stop)

	// Process clients: a slot's incarnations are killed and replaced.
	type slot struct {
		cur  *soakProc
		past []*soakProc
	}
	slots := make([]*slot, soakProcesses)
	var errs []error
	defer func() {
		stopAll()
		for _, sl := range slots {
			if sl != nil && sl.cur != nil {
				sl.cur.kill()
			}
		}
		for _, g := range gos {
			<-g.done
		}
		<-hostile.done
	}()
	for i := range slots {
		p, err := startSoakProc(s.Socket(), fmt.Sprintf("p%d.0", i))
		if err != nil {
			t.Fatal(err)
		}
		slots[i] = &slot{cur: p}
	}
	kills := 0
	deadline := time.Now().Add(dur)
	for time.Now().Before(deadline) && len(errs) == 0 {
		time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
		// Kill one process that has done some work, so that every slot does.
		var ready []int
		for i, sl := range slots {
			if sl.cur.st.ops.Load() > 0 {
				ready = append(ready, i)
			}
		}
		if len(ready) == 0 {
			continue
		}
		victim := ready[rng.IntN(len(ready))]
		sl := slots[victim]
		sl.cur.kill()
		kills++
		sl.past = append(sl.past, sl.cur)
		p, err := startSoakProc(s.Socket(), fmt.Sprintf("p%d.%d", victim, len(sl.past)))
		sl.cur = nil
		if err != nil {
			errs = append(errs, err)
			break
		}
		sl.cur = p
	}

	// Every honest client has done some work before they stop (the last
	// incarnations may have started just now).
	soakWait(t, "every client to finish a round", func() bool {
		for _, sl := range slots {
			if sl.cur != nil && sl.cur.st.ops.Load() == 0 {
				select {
				case <-sl.cur.done:
					return true // it failed: reported below
				default:
					return false
				}
			}
		}
		for _, g := range gos {
			if g.st.ops.Load() == 0 {
				select {
				case <-g.done:
				default:
					return false
				}
			}
		}
		return hostile.rounds.Load() > 0 || isDone(hostile.done)
	})
	stopAll()
	for _, sl := range slots {
		if sl.cur == nil {
			continue
		}
		if err := sl.cur.finish(); err != nil {
			errs = append(errs, err)
		}
		sl.past = append(sl.past, sl.cur)
		sl.cur = nil
	}
	for _, g := range gos {
		<-g.done
		if g.err != nil {
			errs = append(errs, fmt.Errorf("client %s: %w", g.name, g.err))
		}
	}
	<-hostile.done
	errs = append(errs, hostile.errs...)

	// Totals.
	var ops, corrupt, miss, busy, slowest int64
	for _, sl := range slots {
		var slotOps int64
		for _, p := range sl.past {
			slotOps += p.st.ops.Load()
			corrupt += p.st.corrupt.Load()
			miss += p.st.miss.Load()
			busy += p.st.busy.Load()
			slowest = max(slowest, p.st.slowest.Load())
			p.mu.Lock()
			for _, e := range p.errs {
				errs = append(errs, fmt.Errorf("client process %s: %s", p.name, e))
			}
			p.mu.Unlock()
		}
		ops += slotOps
		if slotOps == 0 {
			errs = append(errs, fmt.Errorf("process slot %s did nothing", sl.past[0].name))
		}
	}
	for _, g := range gos {
		ops += g.st.ops.Load()
		corrupt += g.st.corrupt.Load()
		miss += g.st.miss.Load()
		busy += g.st.busy.Load()
		slowest = max(slowest, g.st.slowest.Load())
		if g.st.ops.Load() == 0 {
			errs = append(errs, fmt.Errorf("client %s did nothing", g.name))
		}
	}
	corrupt += hostile.st.corrupt.Load()

	// Everything closed: the service's descriptors come back near their start.
	fdSlack := 8
	fds1 := 0
	soakWait(t, "the service's descriptors to come back", func() bool {
		_, fds1 = procStatus(t)
		return fds1 <= fds0+fdSlack
	})
	// A fresh client connects and works.
	var fresh soakStats
	freshStop := make(chan struct{})
	err := soakHonest(freshStop, s.Socket(), "fresh", &fresh, func() { close(freshStop) })
	if err != nil || fresh.ops.Load() == 0 || fresh.corrupt.Load() != 0 {
		errs = append(errs, fmt.Errorf("a fresh client after the soak: %v, %v", err, &fresh))
	}
	soakWait(t, "the fresh client's descriptors to close", func() bool {
		_, fds1 = procStatus(t)
		return fds1 <= fds0+fdSlack
	})
	rss1, _ := procStatus(t)
	st := s.Stats()

	t.Logf("honest: %d ops, %d corrupt reads, %d misses, %d busy, slowest batch %v; %d processes killed",
		ops, corrupt, miss, busy, time.Duration(slowest).Round(time.Millisecond), kills)
	t.Logf("hostile: %d rounds, %v", hostile.rounds.Load(), &hostile.st)
	for _, step := range slices.Sorted(maps.Keys(hostile.spent)) {
		t.Logf("hostile step %-26s %8.2fs in all, longest %6.2fs", step, hostile.spent[step].Seconds(), hostile.longest[step].Seconds())
	}
	t.Logf("service: RSS %d MiB -> %d MiB, fds %d -> %d", rss0>>20, rss1>>20, fds0, fds1)
	t.Logf("service ops: puts %d gets %d arena hits %d spill hits %d misses %d bad ranges %d refused %d timed out %d memory busy %d spill errors %d",
		st.Ops.Puts, st.Ops.Gets, st.Ops.ArenaHits, st.Ops.SpillHits, st.Ops.Misses, st.Ops.BadRanges, st.Ops.Refused, st.Ops.TimedOut, st.Ops.MemoryBusy, st.Ops.SpillErrors)

	for _, err := range errs {
		t.Error(err)
	}
	if corrupt != 0 {
		t.Errorf("%d corrupt reads", corrupt)
	}
	if ops == 0 || hostile.rounds.Load() == 0 {
		t.Errorf("%d honest ops, %d hostile rounds", ops, hostile.rounds.Load())
	}
	if rss1 > rss0+1<<30 {
		t.Errorf("service RSS grew from %d MiB to %d MiB", rss0>>20, rss1>>20)
	}
}

// soakWait polls cond until it holds, failing the test after two minutes: a
// client process of the race-enabled binary may take a while to start on a
// busy machine.
func soakWait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
