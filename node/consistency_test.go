package node

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratakv/strata/internal/redistest"
	"github.com/stratakv/strata/node/wire"
)

// batchResult is the outcome of a request sent by async.
type batchResult struct {
	results []wire.Result
	err     error
}

// async sends a Put or Get of items on c's connection from another goroutine
// and delivers its outcome; it never touches c.t, so the test's goroutine
// reports. c must have no other request in flight until the result arrives.
func (c *rawClient) async(t wire.Type, items ...wire.Item) <-chan batchResult {
	c.id++
	id := c.id
	var msg wire.Message = wire.Put{Items: items}
	if t == wire.TypeGet {
		msg = wire.Get{Items: items}
	}
	out := make(chan batchResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.conn.Send(ctx, t, id, msg); err != nil {
			out <- batchResult{err: err}
			return
		}
		h, m, _, err := c.conn.Recv(ctx)
		switch {
		case err != nil:
			out <- batchResult{err: err}
		case h.ID != id:
			out <- batchResult{err: fmt.Errorf("reply to request %d, want %d", h.ID, id)}
		default:
			r, ok := m.(*wire.BatchReply)
			if !ok {
				out <- batchResult{err: fmt.Errorf("reply %T", m)}
				return
			}
			out <- batchResult{results: r.Results}
		}
	}()
	return out
}

// await waits for an async request, or fails the test after 10 s.
func await(t *testing.T, what string, ch <-chan batchResult) []wire.Result {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.results
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no answer in 10 s", what)
	}
	return nil
}

// gate holds the first request that reserves key, once armed, until released.
type gate struct {
	key      string
	armed    atomic.Bool
	once     sync.Once
	held     chan struct{} // closed when the first reservation of key is held
	release  func()
	released chan struct{}
	waiting  chan struct{} // one token per request that goes to wait for key while it is held
}

// newGate returns an armed gate for key.
func newGate(key string) *gate {
	g := &gate{key: key, held: make(chan struct{}), released: make(chan struct{}), waiting: make(chan struct{}, 16)}
	g.release = sync.OnceFunc(func() { close(g.released) })
	g.armed.Store(true)
	return g
}

func (g *gate) hooks() *hooks {
	return &hooks{
		reserved: func(key string) {
			if key != g.key || !g.armed.Load() {
				return
			}
			first := false
			g.once.Do(func() { first = true })
			if first {
				close(g.held)
				<-g.released
			}
		},
		awaiting: func(key string) {
			if key != g.key {
				return
			}
			select {
			case <-g.held:
				g.waiting <- struct{}{}
			default: // a request's own miss before the held write began
			}
		},
	}
}

// A put of a key that another request is still writing must not answer OK
// before the object is readable: the client's next Get would miss what it was
// told is stored. It used to (Reserve's ErrExists counted as stored), and
// TestConformance/concurrency of the node client failed now and then with a
// get of a key right after its put answered OK.
func TestPutOfAKeyBeingWrittenAnswersOnceReadable(t *testing.T) {
	g := newGate("k")
	s := start(t, func(c *Config) { c.hooks = g.hooks() })
	t.Cleanup(g.release) // runs before the server's Close, which waits for the held put
	a, b := dial(t, s), dial(t, s)
	ra, sa := a.segment(1 << 20)
	rb, sb := b.segment(1 << 20)
	for i := range 4096 {
		ra.Bytes()[i] = byte(i*5 + 3)
		rb.Bytes()[i] = byte(i*5 + 3)
	}
	aPut := a.async(wire.TypePut, item("k", sa, 0, 4096))
	select {
	case <-g.held:
	case r := <-aPut:
		t.Fatalf("A's put finished without being held: %+v", r)
	case <-time.After(10 * time.Second):
		t.Fatal("A's put never reserved k")
	}
	// B puts k while A's write of it is pending.
	bPut := b.async(wire.TypePut, item("k", sb, 0, 4096))
	select {
	case <-g.waiting:
		// B waits for A's write: the fixed behaviour.
	case r := <-bPut:
		// B answered while A's write is pending: k must be readable right now.
		if r.err != nil || len(r.results) != 1 {
			t.Fatalf("B's put: %+v", r)
		}
		if r.results[0].Status == wire.OK {
			if res := b.batch(wire.TypeGet, item("k", sb, 8192, 4096)); res[0].Status != wire.OK {
				t.Fatalf("B's put of k answered OK while A's write of k was pending, and B's get then answered %v", res[0].Status)
			}
		}
	case <-time.After(10 * time.Second):
		t.Fatal("B's put neither answered nor waited")
	}
	g.release()
	if res := await(t, "A's put", aPut); res[0].Status != wire.OK {
		t.Fatalf("A's put: %+v", res[0])
	}
	if res := await(t, "B's put", bPut); res[0].Status != wire.OK {
		t.Fatalf("B's put: %+v", res[0])
	}
	if res := b.batch(wire.TypeGet, item("k", sb, 8192, 4096)); res[0].Status != wire.OK {
		t.Fatalf("B's get after both puts: %+v", res[0])
	}
	if !bytes.Equal(rb.Bytes()[8192:8192+4096], ra.Bytes()[:4096]) {
		t.Fatal("B read other bytes than A wrote")
	}
	if st := s.Stats(); st.Ops.PutObjects != 1 || st.Ops.PutSkipped != 1 || st.Ops.Misses != 0 {
		t.Fatalf("ops %+v: want one object written, one put skipped, no miss", st.Ops)
	}
}

// A get of an object that another get is promoting from the spill directory is
// a hit, not a miss: the object is there.
func TestGetDuringAPromotionIsAHit(t *testing.T) {
	g := newGate("o0")
	g.armed.Store(false) // not the put of o0, its promotion
	s := start(t, func(c *Config) { c.ArenaBytes = 1 << 20; c.SpillDir = t.TempDir(); c.hooks = g.hooks() })
	t.Cleanup(g.release)
	a, b := dial(t, s), dial(t, s)
	ra, sa := a.segment(4 << 20)
	rb, sb := b.segment(1 << 20)
	mem := ra.Bytes()
	for i := 0; i < 32; i++ {
		for j := 0; j < 64<<10; j++ {
			mem[i*(64<<10)+j] = byte(i + j)
		}
		if res := a.batch(wire.TypePut, item(fmt.Sprintf("o%d", i), sa, uint64(i*(64<<10)), 64<<10)); res[0].Status != wire.OK {
			t.Fatalf("put %d: %+v", i, res[0])
		}
	}
	// Which objects region eviction frees first depends on where the
	// background eviction has got to: more puts, within a bound, until o0 goes.
	for i := 0; s.arena.Contains("o0", 7); i++ {
		if i == 400 {
			t.Fatalf("o0 was not spilled after %d more puts: %+v", i, s.Stats().Arena)
		}
		if res := a.batch(wire.TypePut, item(fmt.Sprintf("more%d", i), sa, 3<<20, 64<<10)); res[0].Status != wire.OK {
			t.Fatalf("put more%d: %+v", i, res[0])
		}
	}
	g.armed.Store(true)
	aGet := a.async(wire.TypeGet, item("o0", sa, 3<<20, 64<<10))
	select {
	case <-g.held: // A promotes o0: reserved in the arena, not yet readable there
	case r := <-aGet:
		t.Fatalf("A's get finished without promoting: %+v", r)
	case <-time.After(10 * time.Second):
		t.Fatal("A's get never promoted o0")
	}
	bGet := b.async(wire.TypeGet, item("o0", sb, 0, 64<<10))
	select {
	case <-g.waiting:
	case r := <-bGet:
		if r.err != nil || r.results[0].Status != wire.OK {
			t.Fatalf("B's get of o0 while A promotes it: %+v; the object is in the spill directory", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("B's get neither answered nor waited")
	}
	g.release()
	if res := await(t, "A's get", aGet); res[0].Status != wire.OK {
		t.Fatalf("A's get: %+v", res[0])
	}
	if res := await(t, "B's get", bGet); res[0].Status != wire.OK {
		t.Fatalf("B's get: %+v", res[0])
	}
	if !bytes.Equal(rb.Bytes()[:64<<10], mem[:64<<10]) || !bytes.Equal(mem[3<<20:3<<20+64<<10], mem[:64<<10]) {
		t.Fatal("a get served other bytes than the spilled object's")
	}
	if st := s.Stats(); st.Ops.Misses != 0 {
		t.Fatalf("ops %+v: a get of a stored object counted as a miss", st.Ops)
	}
}

// metric reads one sample from the service's /metrics: name with its labels as
// Prometheus prints them, e.g. `strata_node_remote_gets_total{result="hit"}`.
func metric(t *testing.T, s *Server, sample string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + s.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("/metrics has no %s:\n%s", sample, body)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// strata_node_misses_total counts get objects found in no tier, Redis included,
// and never goes down: a local miss that Redis then serves is not counted and
// uncounted (a scrape in between saw the counter fall). The remote tier's
// activity is exported too.
func TestRemoteHitsKeepMissesMonotonicAndAreExported(t *testing.T) {
	redis := redistest.Start(t)
	var mu sync.Mutex
	var during []int64
	var bp atomic.Pointer[Server]
	a := start(t, func(c *Config) { c.RemoteAddrs = []string{redis.Addr()} })
	b := start(t, func(c *Config) {
		c.RemoteAddrs = []string{redis.Addr()}
		c.hooks = &hooks{beforeRemoteGet: func() {
			mu.Lock()
			during = append(during, bp.Load().Stats().Ops.Misses)
			mu.Unlock()
		}}
	})
	bp.Store(b)
	waitRemoteConnected(t, a)
	waitRemoteConnected(t, b)
	ca, cb := dial(t, a), dial(t, b)
	_, sa := ca.segment(1 << 20)
	_, sb := cb.segment(1 << 20)
	if res := ca.batch(wire.TypePut, item("p:0", sa, 0, 4096)); res[0].Status != wire.OK {
		t.Fatalf("put through node A: %+v", res)
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.Stats().Remote.Written < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("node A did not write through: %+v", a.Stats().Remote)
		}
		time.Sleep(5 * time.Millisecond)
	}
	res := cb.batch(wire.TypeGet, item("p:0", sb, 0, 4096), item("p:9", sb, 8192, 4096))
	if res[0].Status != wire.OK || res[1].Status != wire.NotFound {
		t.Fatalf("get through node B: %+v", res)
	}
	after := b.Stats().Ops.Misses
	mu.Lock()
	seen := append([]int64(nil), during...)
	mu.Unlock()
	if len(seen) != 1 {
		t.Fatalf("node B asked Redis %d times, want 1", len(seen))
	}
	if seen[0] > after {
		t.Fatalf("misses went from %d (while Redis was asked) down to %d: a counter must never go down", seen[0], after)
	}
	if after != 1 {
		t.Fatalf("misses = %d after a get of a key Redis had and one nobody had, want 1", after)
	}
	for sample, want := range map[string]float64{
		`strata_node_misses_total`:                          1,
		`strata_node_remote_gets_total{result="hit"}`:       1,
		`strata_node_remote_gets_total{result="miss"}`:      1,
		`strata_node_remote_connected`:                      1,
		`strata_node_remote_writes_total{result="written"}`: 0,
		`strata_node_remote_faults_total`:                   0,
	} {
		if got := metric(t, b, sample); got != want {
			t.Errorf("node B %s = %v, want %v", sample, got, want)
		}
	}
	if got := metric(t, a, `strata_node_remote_writes_total{result="written"}`); got != 1 {
		t.Errorf("node A remote writes = %v, want 1", got)
	}
	if got := metric(t, a, `strata_node_remote_queued_bytes`); got != 0 {
		t.Errorf("node A queued bytes = %v, want 0 once written", got)
	}
}
