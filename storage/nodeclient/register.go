package nodeclient

import (
	"context"
	"fmt"
	"sync"

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

func registerOn(ctx context.Context, conn *wire.Conn, p *poolReg) (uint32, error) {
	m, err := roundTrip(ctx, conn, wire.TypeRegisterSegment, wire.RegisterSegment{Size: p.size, Name: p.spec.Name}, p.fd)
	if err != nil {
		if st := wire.StatusOf(err); st == wire.Quota || st == wire.BadRange {
			return 0, fmt.Errorf("node service refused pool %q: %w: %w", p.spec.Name, err, storage.ErrRegistration)
		}
		return 0, err
	}
	r, ok := m.(*wire.RegisterSegmentReply)
	if !ok {
		return 0, fmt.Errorf("node service answered %T to RegisterSegment: %w", m, storage.ErrIO)
	}
	return r.SegmentID, nil
}
