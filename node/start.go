package node

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"time"

	"github.com/stratakv/strata/internal/undo"
	"github.com/stratakv/strata/node/arena"
	"github.com/stratakv/strata/storage"
)

// Starting and restarting. The service listens within milliseconds of New
// whatever the arena's size: the arena populates its memory in the background
// and hands it out as it goes, and an arena file left by the service before
// (killed, crashed or stopped for an upgrade) has its objects recovered in the
// background too (node/arena). Meanwhile requests are served from what is
// ready, and the service says it is starting: Stats().Start, the admin port's
// /readyz (503 until ready; /healthz stays the liveness check and answers 200
// with the same words), and HelloReply.Starting, so that no client mistakes
// a starting service for a dead one. The spill's segments are indexed in the
// background as well (node/spill's scan.go: after a crash left them without
// hint files, that reads them whole, seconds per GiB): until it is done the
// spill's objects of the run before are misses, while puts, removes and
// what this run spills work as usual, and the service says it is starting.

// New starts a service: it creates the socket's directory (and a named
// arena file's) when missing, checks the spill directory (creating it, and
// creating and removing a file in it), listens on the socket (and the admin
// port), and only then maps the arena, so that a refusal costs no memory; it
// accepts clients until Close. It returns within milliseconds whatever the
// arena's size: the arena warms its memory, and recovers the objects of its
// arena file, in the background.
//
// A New that is refused leaves the file system as it found it: it removes
// what it created (directories, the spill's lock file, the socket, an arena
// file it made), the newest first, and nothing that was there before: an
// arena file that holds a warm cache, a directory or lock file of the
// operator's or of another service's (internal/undo).
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var made undo.Log
	s, err := startServer(cfg, &made)
	if err != nil {
		if uerr := made.Undo(); uerr != nil {
			log := cfg.Logger
			if log == nil {
				log = slog.Default()
			}
			log.Warn("a refused start could not remove all it created", "err", uerr, "fix", "remove them by hand")
		}
		return nil, err
	}
	return s, nil
}

// makeDirs creates the socket's directory, as a daemon's runtime directory
// (/run/strata for the default socket) is: only the service's own socket goes
// in it, so others may list it but not write. An arena file named on purpose
// (not the fallback beside the socket) gets its directory too, which only the
// service's user may list: it holds the cache's contents.
func makeDirs(cfg Config, made *undo.Log) error {
	if dir := filepath.Dir(cfg.Socket); cfg.Socket != "" && cfg.Socket[0] != '@' {
		if err := made.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("socket (--socket) %s: cannot create its directory: %v; create %s, or choose a socket path in a directory this user can write: %w",
				cfg.Socket, err, dir, ErrConfig)
		}
	}
	if cfg.ArenaFile != "" && !cfg.ArenaFileFallback {
		if err := made.MkdirAll(filepath.Dir(cfg.ArenaFile), 0o700); err != nil {
			return fmt.Errorf("arena file (--arena-file) %s: cannot create its directory: %v; create it, or choose a path on a tmpfs this user can write: %w",
				cfg.ArenaFile, err, ErrConfig)
		}
	}
	return nil
}

// StartStats is how the service's start went: what it kept of the service
// before, and whether it is ready.
type StartStats struct {
	// State is StateStarting while the arena's memory is being populated or
	// its file's objects recovered, or the spill's segments indexed (the
	// service serves already, from what is ready), then StateReady.
	State string `json:"state"`
	// ReadyPercent is how much of the arena is ready: populated and given to
	// objects, and (on a restart) read back from the arena file.
	ReadyPercent float64 `json:"readyPercent"`
	// Message says it in words, for people: "starting (37% of the arena
	// ready)" or "ready".
	Message string `json:"message"`
	// InstanceID is random per start of the service (HelloReply.InstanceID).
	InstanceID uint64 `json:"instanceId"`
	// ContentID names the arena's contents (HelloReply.ContentID): the same
	// across restarts that kept them, new when the service started empty.
	ContentID uint64 `json:"contentId"`
	// Warm is true when this start kept the contents of the service before:
	// it found the objects of its arena file. ColdReason says why not.
	Warm       bool   `json:"warm"`
	ColdReason string `json:"coldReason,omitempty"`
	// ArenaFile is the arena's file ("" for anonymous memory); Restarts
	// counts the services started on it before this one (kept in the file).
	ArenaFile string `json:"arenaFile,omitempty"`
	Restarts  uint64 `json:"restarts"`
	// PreviousClean is true when the service before shut down cleanly
	// (SIGTERM), false after a kill or a crash.
	PreviousClean bool `json:"previousClean"`
	// Recovered counts the objects found in the arena file, Lost the ones
	// found damaged (dropped, never served), and DroppedAtStart those an
	// arena file of another geometry held (a cold start drops them).
	Recovered      int64 `json:"recovered"`
	Lost           int64 `json:"lost"`
	DroppedAtStart int64 `json:"droppedAtStart,omitempty"`
	// Unsealed counts the large objects the service before committed and
	// was killed before it sealed: a restart cannot tell their bytes from
	// damage, so it drops them (node/arena's seal.go; a SIGTERM seals all).
	Unsealed int64 `json:"unsealed"`
	// LostEvicted counts objects the service before evicted to the spill just
	// before it was killed that are in neither tier now: the spill still held
	// them in its write buffers, which die with the process (a SIGTERM writes
	// them out). Checked once the start is over, from the arena file's
	// eviction log; EvictionsChecked is how many evictions it named.
	LostEvicted      int64 `json:"lostEvicted"`
	EvictionsChecked int64 `json:"evictionsChecked"`
	// ListeningAfter is the time from New to accepting connections;
	// ReadyAfter, to ready (0 while starting).
	ListeningAfter time.Duration `json:"listeningAfter"`
	ReadyAfter     time.Duration `json:"readyAfter,omitempty"`
}

// Start states.
const (
	StateStarting = "starting"
	StateReady    = "ready"
)

// newInstanceID is a random nonzero id; crypto/rand never fails on Linux.
func newInstanceID() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) | 1
}

// startStats describes the start from the arena's stats.
func (s *Server) startStats(a arena.Stats) StartStats {
	r := a.Recovery
	st := StartStats{InstanceID: s.instanceID, ContentID: r.ContentID, Warm: r.Warm, ColdReason: r.Cold, ArenaFile: r.File,
		PreviousClean: r.PreviousClean, Recovered: r.Recovered, Lost: r.Lost, DroppedAtStart: r.DroppedAtStart, Unsealed: r.Unsealed,
		ListeningAfter: s.listeningAfter, LostEvicted: s.lostEvicted.Load(), EvictionsChecked: s.evictionsChecked.Load()}
	if r.Starts > 0 && r.File != "" {
		st.Restarts = r.Starts - 1
	}
	if a.Ready && s.startChecked.Load() {
		st.State, st.ReadyPercent, st.Message = StateReady, 100, StateReady
		st.ReadyAfter = time.Duration(s.readyAfter.Load())
		return st
	}
	pct := 100 * float64(a.ReadyBytes) / float64(max(a.SizeBytes, 1))
	if r.Recovering && r.Slabs > 0 {
		pct = min(pct, 100*float64(r.SlabsRead)/float64(r.Slabs))
	}
	pct = min(math.Floor(pct), 99) // "100%" only once ready
	st.State, st.ReadyPercent = StateStarting, pct
	what := fmt.Sprintf("%.0f%% of the arena ready", pct)
	if r.Recovering {
		what += fmt.Sprintf(", %d objects recovered so far", r.Recovered)
	}
	if s.spill != nil {
		if done, scanned, total := s.spill.ScanProgress(); !done {
			sp := min(math.Floor(100*float64(scanned)/float64(max(total, 1))), 99)
			if a.Ready {
				what = "the arena ready"
			}
			what += fmt.Sprintf(", %.0f%% of the spill indexed", sp)
			st.ReadyPercent = min(pct, sp)
		}
	}
	st.Message = "starting (" + what + ")"
	return st
}

// watchReady logs when the arena and the spill are done starting, and checks
// the evictions the service before made just before it ended (checkEvictions:
// the spill must have indexed them first).
func (s *Server) watchReady() {
	defer s.wg.Done()
	select {
	case <-s.arena.Ready():
	case <-s.done:
		return
	}
	if s.spill != nil {
		select {
		case <-s.spill.Ready():
		case <-s.done:
			return
		}
	}
	s.checkEvictions()
	d := time.Since(s.started)
	s.readyAfter.Store(int64(d))
	s.startChecked.Store(true)
	st := s.arena.Stats()
	s.log.Info("node service ready", "after", d.Round(time.Millisecond), "listeningAfter", s.listeningAfter.Round(time.Microsecond),
		"warm", st.Recovery.Warm, "objects", st.Objects, "recovered", st.Recovery.Recovered, "lost", st.Recovery.Lost, "unsealed", st.Recovery.Unsealed,
		"arenaWarmup", st.WarmupTook.Round(time.Millisecond))
}

// checkEvictions looks for the objects the service before evicted to the
// spill shortly before it ended (the arena file's eviction log) in the arena
// and the spill: one in neither was lost with the spill's write buffers when
// that service was killed. They are counted (Stats().Start.LostEvicted) and
// logged, so that every object a client was told is stored is either served
// or reported lost, once.
func (s *Server) checkEvictions() {
	recent := s.arena.RecentEvictions()
	if len(recent) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(s.life, s.cfg.RequestTimeout)
	defer cancel()
	var lost int64
	var sample []string
	for _, e := range recent {
		if s.arena.Contains(e.Key, e.Format) {
			continue
		}
		if s.spill != nil {
			if _, err := s.spill.ObjectSize(ctx, e.Key, storage.Format(e.Format)); err == nil {
				continue
			}
		}
		lost++
		if len(sample) < 5 {
			sample = append(sample, e.Key)
		}
	}
	s.evictionsChecked.Store(int64(len(recent)))
	s.lostEvicted.Store(lost)
	// Settled: the next start reports neither these losses again nor, as
	// lost by a kill, one found now that the spill drops later.
	s.arena.ForgetEvictions(recent)
	if lost > 0 {
		s.log.Warn("objects evicted to the spill just before the service before was killed are gone: they were still in the spill's write buffers",
			"lost", lost, "evictionsChecked", len(recent), "keys", sample, "fix", "stop the service with SIGTERM, which writes the buffers out")
	}
}
