package node

import (
	"context"
	"errors"
	"fmt"
)

// remove removes keys from every tier and returns how many were found in at
// least one. A remove must win over everything in flight on its keys, or a
// removed object comes back and a later put of new bytes under the key is
// skipped as write-once while gets serve the old ones. So, per key:
//
//   - the arena's removal is a barrier (arena.BeginRemove): it takes the
//     object out, waits for an eviction of it in flight to finish storing it
//     in the spill, dooms a write of it still pending (a promotion from the
//     spill or Redis among them), and keeps new copies out until every tier
//     has removed the key;
//   - the spill then finds whatever the eviction stored, and its tombstones are
//     on disk before the reply, so the remove survives a restart;
//   - Redis is asked last, after any write-through of the key in flight.
//
// An error means the keys are gone from memory but a tombstone could not be
// written: they may come back after a restart.
func (s *Server) remove(ctx context.Context, keys []string) (int, error) {
	// A copy of a key in a part of the arena file not recovered yet would
	// come back after the removal (node/arena's recover.go).
	if err := s.arena.AwaitRecovered(ctx); err != nil {
		return 0, fmt.Errorf("%w: removed nothing; retry once it is ready (%v)", errStarting, err)
	}
	removed := make([]bool, len(keys))
	for i, k := range keys {
		var end func()
		removed[i], end = s.arena.BeginRemove(k)
		defer end()
	}
	var errs []error
	if s.spill != nil {
		// One batch: its tombstones are written (not only buffered) before it
		// returns, with one buffer write for them all.
		had, err := s.spill.RemoveObjects(ctx, keys)
		if err != nil {
			errs = append(errs, err)
		}
		for i, h := range had {
			removed[i] = removed[i] || h
		}
	}
	if s.remote != nil {
		for i, k := range keys {
			had, err := s.remote.remove(ctx, k)
			if err != nil {
				s.log.Warn("node service: removing an object from Redis failed; another node may still serve it", "key", k, "err", err)
			}
			removed[i] = removed[i] || had
		}
	}
	n := 0
	for _, r := range removed {
		if r {
			n++
		}
	}
	if err := errors.Join(errs...); err != nil {
		s.log.Warn("node service: removed objects whose removal the spill could not record; they may be back after a restart", "objects", len(keys), "err", err)
		return n, fmt.Errorf("removed %d objects from memory, but the spill could not record the removal, so they may be back after a restart (remove them again once the spill's device is healthy): %w", n, err)
	}
	return n, nil
}
