package nodeclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/node/wire"
)

// fakeService speaks the node protocol on a real Unix socket, with the answers
// and the connection drops a test scripts, so that a test can put the client in
// states a real service reaches only by chance. It stores nothing: every Put and
// Get item is answered OK, every Exists with 0. It checks what the real service
// cannot: that every range of an item names the segment of the pool the item's
// object belongs to, on the connection the request came on.
type fakeService struct {
	ln *net.UnixListener
	wg sync.WaitGroup

	// onHello runs when connection n (0 first) says Hello, before the reply.
	onHello func(n int)
	// onRegister runs when connection n asks to register the segment of pool
	// name, before the reply; drop true closes the connection instead of
	// answering.
	onRegister func(n int, name string) (drop bool)
	// segmentID is the id connection n gives pool name's segment.
	segmentID func(n int, name string) uint32
	// onBatch runs when connection n has received a Put or Get, before the
	// reply; drop true closes the connection instead of answering.
	onBatch func(n int) (drop bool)
	// revision is what HelloReply.Revision says: 0, as a service before
	// revisions answers, unless a test sets it.
	revision uint32

	mu         sync.Mutex
	closed     bool
	conns      []*wire.Conn
	segments   []map[uint32]string // per connection: segment id -> pool name
	batches    []int               // per connection: Put and Get requests served
	runItems   []int               // per connection: items named by runs
	rangeItems []int               // per connection: items named by ranges
	violations []string
}

// startFake listens on socket; the hooks must be set before a client connects.
func startFake(t *testing.T, socket string) *fakeService {
	t.Helper()
	ln, err := wire.Listen(socket, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeService{ln: ln,
		onHello:    func(int) {},
		onRegister: func(int, string) bool { return false },
		segmentID:  func(n int, name string) uint32 { return 0 },
		onBatch:    func(int) bool { return false },
	}
	t.Cleanup(f.close)
	return f
}

// serve accepts connections until close. Call it once the hooks are set.
func (f *fakeService) serve() {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			uc, err := f.ln.AcceptUnix()
			if err != nil {
				return
			}
			conn := wire.NewConn(uc)
			f.mu.Lock()
			if f.closed {
				f.mu.Unlock()
				_ = conn.Close()
				return
			}
			n := len(f.conns)
			f.conns = append(f.conns, conn)
			f.segments = append(f.segments, map[uint32]string{})
			f.batches = append(f.batches, 0)
			f.runItems, f.rangeItems = append(f.runItems, 0), append(f.rangeItems, 0)
			f.mu.Unlock()
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				f.session(n, conn)
			}()
		}
	}()
}

func (f *fakeService) session(n int, conn *wire.Conn) {
	defer conn.Close()
	ctx := context.Background()
	for {
		h, msg, fds, err := conn.Recv(ctx)
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
		if err != nil {
			return
		}
		var rt wire.Type
		var reply wire.Message
		switch m := msg.(type) {
		case *wire.Hello:
			f.onHello(n)
			rt, reply = wire.TypeHelloReply, wire.HelloReply{ClientID: uint64(n + 1), MaxBatch: wire.MaxItems, Revision: f.revision}
			if m.Revision != wire.Revision {
				f.mu.Lock()
				f.violations = append(f.violations, fmt.Sprintf("connection %d: Hello revision %d, want %d", n, m.Revision, wire.Revision))
				f.mu.Unlock()
			}
		case *wire.RegisterSegment:
			if f.onRegister(n, m.Name) {
				return
			}
			id := f.segmentID(n, m.Name)
			if id == 0 {
				f.mu.Lock()
				id = uint32(len(f.segments[n]) + 1)
				f.mu.Unlock()
			}
			f.mu.Lock()
			f.segments[n][id] = m.Name
			f.mu.Unlock()
			rt, reply = wire.TypeRegisterSegmentReply, wire.RegisterSegmentReply{SegmentID: id}
		case *wire.Exists:
			rt, reply = wire.TypeExistsReply, wire.ExistsReply{}
		case *wire.Put:
			f.check(n, m.Items)
			if f.onBatch(n) {
				return
			}
			rt, reply = wire.TypeBatchReply, wire.BatchReply{Results: make([]wire.Result, len(m.Items))}
		case *wire.Get:
			f.check(n, m.Items)
			rt, reply = wire.TypeBatchReply, wire.BatchReply{Results: make([]wire.Result, len(m.Items))}
		default:
			rt, reply = wire.TypeError, wire.Error{Code: wire.Internal, Message: fmt.Sprintf("the fake does not serve %v", h.Type)}
		}
		if err := conn.Send(ctx, rt, h.ID, reply); err != nil {
			return
		}
	}
}

// check records every range that names a segment other than the one of its
// object's pool on connection n.
func (f *fakeService) check(n int, items []wire.Item) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batches[n]++
	for _, it := range items {
		want := "kv"
		if strings.Contains(it.Key, "_draft_") {
			want = "draft"
		}
		segs := make([]uint32, 0, len(it.Ranges)+len(it.Runs))
		for _, r := range it.Ranges {
			segs = append(segs, r.Segment)
		}
		for _, r := range it.Runs {
			segs = append(segs, r.Segment)
		}
		if len(it.Runs) > 0 {
			f.runItems[n]++
			if f.revision < 2 {
				f.violations = append(f.violations, fmt.Sprintf("connection %d: object %s named by runs on a connection of revision %d", n, it.Key, f.revision))
			}
		} else {
			f.rangeItems[n]++
		}
		for _, seg := range segs {
			if got, ok := f.segments[n][seg]; !ok || got != want {
				f.violations = append(f.violations, fmt.Sprintf("connection %d: object %s of pool %q names segment %d, which is %q there",
					n, it.Key, want, seg, got))
			}
		}
	}
}

// drop closes connection n from the service's side.
func (f *fakeService) drop(n int) {
	f.mu.Lock()
	c := f.conns[n]
	f.mu.Unlock()
	_ = c.Close()
}

func (f *fakeService) connections() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.conns)
}

// served is the Put and Get requests connection n served.
func (f *fakeService) served(n int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n >= len(f.batches) {
		return 0
	}
	return f.batches[n]
}

// forms is how many items connection n saw named by runs and by ranges.
func (f *fakeService) forms(n int) (runs, ranges int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.runItems[n], f.rangeItems[n]
}

// registered is connection n's segments by pool name.
func (f *fakeService) registered(n int) map[string]uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]uint32{}
	for id, name := range f.segments[n] {
		out[name] = id
	}
	return out
}

func (f *fakeService) problems() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.violations) == 0 {
		return nil
	}
	return errors.New(strings.Join(f.violations, "\n"))
}

func (f *fakeService) close() {
	_ = f.ln.Close()
	f.mu.Lock()
	f.closed = true
	for _, c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}
