package storagebench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"
)

// removeWritten removes every object the run wrote from a store that outlives it.
func (r *run) removeWritten() error {
	if r.cfg.Keep || !r.targetBuilt || r.target.Remove == nil || len(r.engines) == 0 {
		return nil
	}
	var names []string
	for _, e := range r.engines {
		for b := range e.keys {
			names = append(names, e.names(b)...)
		}
	}
	r.progress("removing the run's %d objects from the %s backend", len(names), r.rep.Backend)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.target.Remove(ctx, names); err != nil {
		return fmt.Errorf("remove the run's objects from the %s backend: %w", r.rep.Backend, err)
	}
	return nil
}

// closePeers closes the one-engine peers: the stored chunks of the memcpy and
// disk peers, and the Redis server. It may be called more than once.
func (r *run) closePeers() error {
	if r.peersClosed {
		return nil
	}
	r.peersClosed = true
	var errs []error
	for _, p := range []Peer{r.target.Peer, r.target.Stream, r.target.Redis} {
		if p != nil {
			if err := p.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close peer: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// close releases everything the run opened and removes the scratch directory
// unless it is to be kept.
func (r *run) close() error {
	errs := []error{r.removeWritten()}
	if r.targetBuilt {
		errs = append(errs, r.closePeers())
		if r.target.Pair != nil {
			if err := r.target.Pair.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close peer: %w", err))
			}
		}
	}
	for _, b := range r.backends {
		if err := b.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s backend: %w", r.rep.Backend, err))
		}
	}
	for _, g := range r.groups {
		if err := g.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if r.targetBuilt && r.target.Close != nil {
		if err := r.target.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close the %s target: %w", r.rep.Backend, err))
		}
	}
	if !r.cfg.Keep {
		if err := os.RemoveAll(r.scratch); err != nil {
			errs = append(errs, fmt.Errorf("remove scratch directory: %w", err))
		}
	}
	return errors.Join(errs...)
}
