package storagebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node"
	"github.com/stratakv/strata/storage"
	"github.com/stratakv/strata/storage/nodeclient"
)

// arenaGrain is the unit the node service's arena allocates in (its
// alignment), which bounds from below what a small object takes there.
const arenaGrain = 4096

// NodeTarget measures storage/nodeclient against the node service: one started
// in the process (its socket in a fresh temporary directory, its arena sized to
// hold every object of the run plus 10 %, no spill) unless s.Socket names a
// running one. The service maps an engine's host pool lazily, so the target is
// Warm: each host pool goes through one untimed batch first. The peer is a
// MemcpyPeer with as many goroutines as the service's copy workers; the peer of
// the phase of s.Engines engines at once has that many times as many (at most
// the machine's cores).
// Unless s.NoRedis, a redis-server started on loopback stores the same objects
// beside it.
func NodeTarget(s Scratch) (t Target, err error) {
	avail := s.Available
	if avail == nil {
		avail = hostmem.AvailableBytes
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// The service stores the run's bytes once for the one engine and once for each
	// engine of the engines phase, and an untimed warm-up batch of each engine's
	// host pool besides (the main engine's pool is engine 1's).
	engines := int64(max(s.Engines, DefaultEngines))
	stored := (1+engines)*s.Bytes + engines*s.BatchBytes
	// The arena gives each object a whole number of its 4 KiB grains: objects
	// smaller than that take a grain each.
	footprint := stored
	if s.ObjectBytes > 0 {
		footprint = stored / s.ObjectBytes * roundUpTo(s.ObjectBytes, arenaGrain)
	}
	arenaBytes := roundUpTo(footprint+footprint/10, 1<<20)
	workers := node.DefaultConfig("").CopyWorkers
	t = Target{Name: BackendNode, Warm: true}
	var closers cleanups
	defer func() {
		if err != nil {
			_ = closers.run()
		}
	}()
	// Close stops the embedded service (after the run has closed its clients) and
	// removes its socket's directory.
	t.Close = closers.run

	// What the run holds at its peak besides the arena: a host pool of two batches
	// per engine, and either the one-engine peers (memcpy, and Redis: its values in
	// jemalloc's size classes, a quarter over for 2 MiB ones, and the replies of one
	// batch in its output buffers) or the engines phase's peer.
	redisBytes := int64(0)
	if !s.NoRedis {
		redisBytes = s.Bytes + s.Bytes/4 + s.BatchBytes
	}
	need := 2*engines*s.BatchBytes + max(s.Bytes+redisBytes, engines*s.Bytes) + hostmem.DefaultConfig(hostmem.Mmap).ReserveBytes
	socket := s.Socket
	if socket == "" {
		need += arenaBytes
	}
	if a, aerr := avail(); aerr == nil && a < need {
		return Target{}, fmt.Errorf("the node run needs %s of host memory (a %s arena, host pools, peers) and %s is available: lower --batches or --pages-per-batch, or give --no-redis: %w: %w",
			formatBytes(need), formatBytes(arenaBytes), formatBytes(a), ErrMemory, ErrConfig)
	}

	if socket == "" {
		// Unix socket paths hold 107 bytes: a short directory, not the scratch one.
		dir, err := os.MkdirTemp("", "st")
		if err != nil {
			return Target{}, fmt.Errorf("node service socket directory: %w", err)
		}
		closers.add(func() error { return os.RemoveAll(dir) })
		socket = filepath.Join(dir, "node.sock")
		cfg := node.DefaultConfig(socket)
		cfg.ArenaBytes = arenaBytes
		// The arena is sized to hold every object; eviction must never start.
		cfg.HighWatermark, cfg.LowWatermark = 0.95, 0.90
		cfg.SpillDir = ""
		cfg.Admin = ""
		cfg.Logger = quiet
		workers = cfg.CopyWorkers
		if s.Progress != nil {
			s.Progress("starting a node service with a %s arena", formatBytes(arenaBytes))
		}
		srv, err := node.New(cfg)
		if err != nil {
			return Target{}, fmt.Errorf("start the node service: %w", err)
		}
		closers.add(srv.Close)
		took, err := awaitReady(srv, arenaBytes)
		if err != nil {
			return Target{}, err
		}
		t.Describe = fmt.Sprintf("embedded service, %s arena holding every object of the run + 10%%, %d copy workers, no spill",
			formatBytes(arenaBytes), workers)
		t.Notes = append(t.Notes, fmt.Sprintf("the embedded service's arena warmed up (its memory populated) in %s before the first batch, "+
			"so that the warm-up does not take the cores the timed batches copy on", took.Round(time.Millisecond)))
	} else {
		if st, err := os.Stat(socket); err != nil || st.Mode().Type() != os.ModeSocket {
			return Target{}, fmt.Errorf("no node service at %s (%s); start one with `strata serve --socket %s`, or leave out --socket to start one in the process",
				socket, describeStat(err), socket)
		}
		t.Describe = "service at " + socket
		waited, first, err := awaitSocketReady(context.Background(), socket, s.Progress)
		if err != nil {
			return Target{}, err
		}
		if waited > 0 {
			t.Notes = append(t.Notes, fmt.Sprintf("the node service at %s was starting (%d%% of its arena ready): the run waited %s for it before the first batch, "+
				"so that its warm-up does not take the cores the timed batches copy on", socket, first, waited.Round(time.Millisecond)))
		}
		t.Remove = func(ctx context.Context, names []string) error { return removeFromNode(ctx, socket, names) }
		t.Notes = append(t.Notes, fmt.Sprintf("the node service at %s is measured as it runs: the memcpy peers assume it has %d copy workers (the default); "+
			"its arena must hold %s (the run's objects %d times over, one engine then %d, and %d warm-up batches) or gets miss; "+
			"the run's objects are in a namespace of their own and removed afterwards (unless --keep)", socket, workers, formatBytes(stored), 1+engines, engines, engines))
	}
	t.New = func(ctx context.Context) (storage.Backend, error) {
		cfg := nodeclient.DefaultConfig(socket)
		cfg.ClientName = "strata-bench-tiers"
		cfg.CallTimeout = 5 * time.Minute // a batch moves 512 MiB or more
		cfg.Logger = quiet
		b, err := nodeclient.New(cfg)
		if err != nil {
			return nil, err
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := b.WaitConnected(wctx); err != nil {
			_ = b.Close()
			return nil, fmt.Errorf("%w; start one with `strata serve --socket %s`, or leave out --socket to start one in the process", err, socket)
		}
		return b, nil
	}

	// The peers map their memory at their first Write; the run closes them.
	t.Peer = &MemcpyPeer{Workers: workers, Capacity: s.Bytes, Available: s.Available}
	want := int(engines) * workers
	pairWorkers := min(want, runtime.NumCPU())
	t.Pair = &MemcpyPeer{Workers: pairWorkers, Capacity: engines * s.Bytes, Available: s.Available}
	t.Notes = append(t.Notes, fmt.Sprintf("memcpy peer: %d goroutines, as many as the service's copy workers, copying the same chunks between two host regions", workers))
	if pairWorkers < want {
		t.Notes = append(t.Notes, fmt.Sprintf("%d-engine memcpy peer: %d goroutines, the machine's cores (%d times the service's %d copy workers would be %d): "+
			"the machine's memcpy, which the service's copy workers, shared by every engine, cannot beat",
			engines, pairWorkers, engines, workers, want))
	} else {
		t.Notes = append(t.Notes, fmt.Sprintf("%d-engine memcpy peer: %d goroutines, %d times the service's copy workers", engines, pairWorkers, engines))
	}

	switch {
	case s.NoRedis:
		t.Notes = append(t.Notes, "redis: skipped (--no-redis)")
	default:
		if s.Progress != nil {
			s.Progress("starting redis-server on loopback")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		rp, err := StartRedis(ctx, s.Dir)
		switch {
		case errors.Is(err, ErrRedisNotInstalled):
			t.Notes = append(t.Notes, "redis: not installed (apt-get install redis-server); no Redis figures")
		case err != nil:
			return Target{}, fmt.Errorf("%w; give --no-redis to run without it", err)
		default:
			t.Redis = rp // the run closes it with the other peers
		}
	}
	return t, nil
}

// awaitReady waits for the service's arena to be warmed up, so that the timed
// batches measure a service in its steady state: the warm-up populates the
// arena in the background (MADV_POPULATE_WRITE, about 2 GB/s), and a profile of
// a run that started at once showed a fifth of the process's CPU in it, on the
// cores the copies needed. It allows a generous 50 MB/s (and 30 s) before it
// gives up, so that a warm-up that cannot finish is an error, not a hang.
func awaitReady(srv *node.Server, arenaBytes int64) (time.Duration, error) {
	start := time.Now()
	limit := 30*time.Second + time.Duration(arenaBytes/50e6)*time.Second
	for {
		st := srv.Stats().Start
		if st.State == node.StateReady {
			return time.Since(start), nil
		}
		if time.Since(start) > limit {
			return 0, fmt.Errorf("the embedded node service's arena of %s is not warmed up after %s (%s: %.0f%% ready)",
				formatBytes(arenaBytes), limit, st.Message, st.ReadyPercent)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// describeStat says why a path is not a socket.
func describeStat(err error) string {
	if err != nil {
		return err.Error()
	}
	return "the path is not a socket"
}

func roundUpTo(n, to int64) int64 { return (n + to - 1) / to * to }
