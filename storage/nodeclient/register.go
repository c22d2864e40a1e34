package nodeclient

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/storage"
)

// poolReg is a registered pool: its spec, a duplicate of its memfd for
// re-registration, and its registration on a connection.
type poolReg struct {
	spec  storage.PoolSpec
	names pagekey.Names
	// tails are the parts' name suffixes when the parts' names differ in those
	// only (partTails), else nil.
	tails  [][]byte
	format uint64
	size   uint64 // the memfd's size, read once: the region may be closed while the dup lives
	fd     int
	// conn is the connection the pool is registered (or being registered) on;
	// segment, its id there (0 until the service answered), is meaningless on
	// any other connection. refused is the service's refusal on conn.
	conn    *wire.Conn
	segment uint32
	refused error
	// users counts registrations sending fd now, so that a RegisterPool that
	// replaces the pool, or Close, closes fd only after them: closed early, its
	// number could be reused and another file sent to the service.
	users sync.WaitGroup
}

// registerOn registers p on conn, a connection being set up that no reader
// goroutine serves yet, and returns its segment id there.
func registerOn(ctx context.Context, conn *wire.Conn, p *poolReg) (uint32, error) {
	m, err := roundTrip(ctx, conn, wire.TypeRegisterSegment, p.request(), p.fd)
	if err != nil {
		if st := wire.StatusOf(err); st == wire.Quota || st == wire.BadRange {
			return 0, p.refusal(err)
		}
		return 0, err
	}
	return segmentOf(m)
}

// request is p's RegisterSegment request; its memfd goes with it.
func (p *poolReg) request() wire.RegisterSegment {
	return wire.RegisterSegment{Size: p.size, Name: p.spec.Name}
}

// refusal is the error of the service refusing to register p.
func (p *poolReg) refusal(err error) error {
	return fmt.Errorf("node service refused pool %q: %w: %w", p.spec.Name, err, storage.ErrRegistration)
}

// segmentOf is the segment id in m, the service's answer to RegisterSegment.
func segmentOf(m wire.Message) (uint32, error) {
	r, ok := m.(*wire.RegisterSegmentReply)
	if !ok {
		return 0, fmt.Errorf("node service answered %T to RegisterSegment: %w", m, storage.ErrIO)
	}
	return r.SegmentID, nil
}

// RegisterPool hands the pool's memfd to the service. The pool must be in shm
// memory (build the group with storage.HostAllocator over this backend). When the
// service is reachable its answer is the result: a refusal (over the client quota,
// a memfd it cannot use) wraps storage.ErrRegistration with the service's reason.
// When it is not, the pool is registered as soon as the client connects, and
// RegisterPool returns nil; the same when the connection is lost (or stops
// answering) during the registration.
func (b *Backend) RegisterPool(ctx context.Context, spec storage.PoolSpec) error {
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("node client: register: %w", err)
	}
	if err := checkKeys(spec); err != nil {
		return err
	}
	fd := spec.Region.Fd()
	if fd < 0 {
		return fmt.Errorf("node client: pool %q is in %s memory, not a memfd the node service can map: build the host group with storage.HostAllocator(backend, ...), which gives it the shm allocator: %w",
			spec.Name, spec.Region.Kind(), storage.ErrRegistration)
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("node client: keep a copy of pool %q's memfd: %v: %w", spec.Name, err, storage.ErrRegistration)
	}
	names := spec.Names
	names.MLA = spec.Layout.Geometry.MLA
	p := &poolReg{spec: spec, names: names, tails: partTails(names, spec.Name), format: uint64(storage.FormatOf(spec.Layout)), fd: dup, size: uint64(spec.Region.Size())}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		_ = unix.Close(dup)
		return fmt.Errorf("node client: %w", storage.ErrClosed)
	}
	old := b.pools[spec.Name]
	b.pools[spec.Name] = p
	// Claimed for the live connection in the same critical section that made it
	// visible: the connector registers it on the next connection, never twice on
	// this one.
	conn := b.conn
	p.conn = conn
	if conn != nil {
		p.users.Add(1)
	}
	b.mu.Unlock()
	if old != nil {
		old.users.Wait()
		_ = unix.Close(old.fd)
	}
	if conn == nil {
		b.log.Warn("node client: the node service is not reachable yet; the pool is registered when it is",
			"pool", spec.Name, "socket", b.cfg.Socket)
		return nil
	}
	err = b.registerLive(ctx, p, conn)
	p.users.Done()
	if errors.Is(err, storage.ErrUnavailable) || errors.Is(err, storage.ErrTimeout) {
		// The connection died (or was dropped for not answering): the next one
		// registers the pool, as if the service had not been reachable.
		b.log.Warn("node client: lost the node service while registering a pool; it is registered on reconnecting",
			"pool", spec.Name, "socket", b.cfg.Socket, "err", err)
		return nil
	}
	return err
}

// registerLive registers p on conn, which serves replies already. A failure
// other than a refusal closes conn: the service may have mapped the segment
// without the client learning its id, and a reconnect registers every pool
// afresh.
func (b *Backend) registerLive(ctx context.Context, p *poolReg, conn *wire.Conn) error {
	m, err := b.callOn(ctx, conn, wire.TypeRegisterSegment, p.request(), p.fd)
	var seg uint32
	if err == nil {
		seg, err = segmentOf(m)
	}
	refused := errors.Is(err, storage.ErrRegistration) || errors.Is(err, storage.ErrNotRegistered)
	if refused {
		err = p.refusal(err)
	}
	b.mu.Lock()
	mine := p.conn == conn
	if mine {
		p.segment, p.refused = seg, nil
		if refused {
			p.refused = err
		}
	}
	b.mu.Unlock()
	if err != nil && !refused && !errors.Is(err, errStale) && mine {
		_ = conn.Close()
	}
	return err
}

// pool returns the registered pool called name, its segment and the connection
// that segment id is valid on: a request built from them must go on that
// connection only.
func (b *Backend) pool(name string) (*poolReg, uint32, *wire.Conn, error) {
	p, seg, conn, _, err := b.poolRuns(name)
	return p, seg, conn, err
}

// poolRuns is pool, and whether requests on the connection may name runs
// (its revision is 2 or later).
func (b *Backend) poolRuns(name string) (*poolReg, uint32, *wire.Conn, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, 0, nil, false, fmt.Errorf("node client: %w", storage.ErrClosed)
	}
	p := b.pools[name]
	switch {
	case p == nil:
		return nil, 0, nil, false, fmt.Errorf("node client: pool %q: %w", name, storage.ErrNotRegistered)
	case p.refused != nil && p.conn == b.conn:
		return nil, 0, nil, false, fmt.Errorf("node client: pool %q: %w: %w", name, p.refused, storage.ErrNotRegistered)
	case b.conn == nil || p.conn != b.conn || p.segment == 0:
		b.conns.refused.Add(1)
		return nil, 0, nil, false, fmt.Errorf("node client: not connected to %s (reconnecting): %w", b.cfg.Socket, storage.ErrUnavailable)
	}
	l := b.links[b.conn]
	return p, p.segment, b.conn, l != nil && l.runs, nil
}

// partTails returns each part's name suffix when the names of a page's parts
// differ only in a suffix that does not depend on the key, as SGLang's spelling
// has them ({key}_{rank}_k, {key}_{rank}_v), so that a batch writes each key's
// hex once a page instead of once a part; nil when there is one part, or when
// that does not hold for two keys of different digest sizes (a spelling that
// changed), and every name is then built whole.
func partTails(names pagekey.Names, pool string) [][]byte {
	parts := names.Parts()
	if parts < 2 {
		return nil
	}
	var d1 [pagekey.MaxDigestSize]byte
	var d2 [16]byte
	for i := range d1 {
		d1[i] = byte(0xa5 + 7*i)
	}
	for i := range d2 {
		d2[i] = byte(0x3c + 11*i)
	}
	k1, err1 := pagekey.KeyFromDigest(d1[:])
	k2, err2 := pagekey.KeyFromDigest(d2[:])
	if err1 != nil || err2 != nil {
		return nil
	}
	first := names.Object(k1, pool, 0)
	common := len(first)
	for part := 1; part < parts; part++ {
		other := names.Object(k1, pool, part)
		n := 0
		for n < min(len(first), len(other)) && first[n] == other[n] {
			n++
		}
		common = min(common, n)
	}
	tails := make([][]byte, parts)
	for part := range parts {
		tails[part] = []byte(names.Object(k1, pool, part)[common:])
	}
	for _, k := range []pagekey.Key{k1, k2} {
		base := names.Object(k, pool, 0)
		if !strings.HasSuffix(base, string(tails[0])) {
			return nil
		}
		for part := 1; part < parts; part++ {
			if names.Object(k, pool, part) != base[:len(base)-len(tails[0])]+string(tails[part]) {
				return nil
			}
		}
	}
	return tails
}

// checkKeys reports whether every object name of spec's pages is a key the node
// service's wire accepts (wire.ValidKey: 1 to wire.MaxKey bytes of printable
// ASCII), so that a pool whose model prefix cannot be served is refused when it
// registers rather than failing every Put. Names are longest for the longest
// digest, which is what is checked.
func checkKeys(spec storage.PoolSpec) error {
	var d [pagekey.MaxDigestSize]byte
	key, err := pagekey.KeyFromDigest(d[:])
	if err != nil {
		return fmt.Errorf("node client: pool %q: %v: %w", spec.Name, err, storage.ErrConfig)
	}
	for _, name := range storage.ObjectNames(spec, key) {
		if err := wire.ValidKey(name); err != nil {
			return fmt.Errorf("node client: pool %q (model prefix %q): its object names are not node service keys: %v; use a printable ASCII model prefix short enough for keys of %d bytes: %w",
				spec.Name, spec.Names.ModelPrefix, err, wire.MaxKey, storage.ErrConfig)
		}
	}
	return nil
}
