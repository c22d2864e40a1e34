// Package node is the per-node service (`strata serve`): it holds L3 objects in
// its own DRAM arena, spills evicted ones to an SSD directory and promotes them
// back on a hit, and moves pages between its tiers and the engines' host pools
// with one memcpy, no data on the socket. Engines connect over a Unix socket,
// register each host pool's memfd once, and from then on name bytes as (segment,
// offset, length) ranges; every range must lie inside a segment that client
// registered. An HTTP admin port on loopback serves /healthz, /metrics and /stats.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stratakv/strata/internal/undo"
	"github.com/stratakv/strata/node/arena"
	"github.com/stratakv/strata/node/spill"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/storage"
)

// MaxBatchObjects is the most objects one Put or Get may name (128 pages of up to
// 32 parts each).
const MaxBatchObjects = wire.MaxItems

// Server is a running node service.
type Server struct {
	cfg     Config
	log     *slog.Logger
	arena   *arena.Arena
	spill   *spill.Store // nil without a spill directory
	remote  *remoteTier  // nil without a remote tier
	ln      *net.UnixListener
	admin   *http.Server
	adminLn net.Listener
	started time.Time
	// instanceID is random per start (HelloReply.InstanceID);
	// listeningAfter, the time from New to accepting (start.go).
	instanceID     uint64
	listeningAfter time.Duration
	// lostEvicted and evictionsChecked are what checkEvictions found;
	// startChecked is set, and readyAfter, once it has run on a ready arena.
	lostEvicted, evictionsChecked, readyAfter atomic.Int64
	startChecked                              atomic.Bool
	// life is canceled when Close has waited ShutdownTimeout: requests in
	// flight derive their contexts from it and fail.
	life         context.Context
	stopRequests context.CancelFunc

	mu       sync.Mutex
	sessions map[uint64]*session
	perUID   map[int]int // connections by peer uid
	closed   bool
	done     chan struct{} // closed by Close: ends the accept loop's backoff
	nextID   atomic.Uint64
	wg       sync.WaitGroup

	st counters
	// acceptErr is the latest failed accept, nil once an accept worked:
	// /healthz reports it while it is recent.
	acceptErr atomic.Pointer[acceptFailure]
	mem       *memBudget
	logs      *logLimiter
	// statsLimit bounds the Stats document a client gets (the frame limit).
	statsLimit int

	// tenants maps client uids to object namespaces (tenant.go).
	tenants tenants
	// registeredBytes is the memory every client together registered, bounded
	// by Config.MaxRegisteredBytes (segment.go).
	registeredBytes atomic.Int64
}

// startServer is New, recording in made what it creates on disk (start.go).
func startServer(cfg Config, made *undo.Log) (*Server, error) {
	s := &Server{cfg: cfg, log: cfg.Logger, sessions: map[uint64]*session{}, perUID: map[int]int{}, started: time.Now(),
		done: make(chan struct{}), mem: newMemBudget(cfg.RequestMemoryBytes), statsLimit: wire.MaxBody - 64<<10,
		instanceID: newInstanceID()}
	s.life, s.stopRequests = context.WithCancel(context.Background())
	if s.log == nil {
		s.log = slog.Default()
	}
	s.logs = newLogLimiter(s.log, time.Minute, 10)
	if cfg.hooks != nil && cfg.hooks.statsLimit > 0 {
		s.statsLimit = cfg.hooks.statsLimit
	}
	var err error
	if s.tenants, err = newTenants(cfg.TenantGroups, os.Getuid()); err != nil {
		return nil, err
	}
	// Read the Redis credentials and CA first: a missing file is a
	// configuration error, found before the arena is mapped.
	var rc RemoteConfig
	if len(cfg.RemoteAddrs) > 0 {
		if rc, err = remoteConfig(cfg, s.log); err != nil {
			return nil, err
		}
	}
	// Everything that can be refused is checked before the arena is mapped
	// (seconds and gigabytes of RSS for a large one): the socket group, the
	// spill directory (created and written to), the socket itself (a service
	// already on it is found here) and the admin port.
	gid := -1
	if cfg.SocketGroup != "" {
		if gid, err = lookupGroup(cfg.SocketGroup); err != nil {
			return nil, err
		}
	}
	if err := makeDirs(cfg, made); err != nil {
		return nil, err
	}
	if cfg.SpillDir != "" {
		if err := probeSpillDir(cfg.SpillDir, made); err != nil {
			return nil, err
		}
	}
	// Until the accept loop starts, engines that connect wait in the backlog.
	if s.ln, err = wire.Listen(cfg.Socket, cfg.SocketMode, gid); err != nil {
		return nil, fmt.Errorf("socket (--socket): %w", err)
	}
	if cfg.Admin != "" {
		if err := s.listenAdmin(); err != nil {
			return nil, errors.Join(err, s.ln.Close())
		}
	}
	// The spill is opened once the socket and the admin port are the
	// service's: opening it starts its writer and compactor on the segments
	// of the service before, which a start refused for a port must not touch.
	if cfg.SpillDir != "" {
		sc := spill.DefaultConfig(cfg.SpillDir)
		sc.CapacityBytes = cfg.SpillBytes
		if cfg.SpillSegmentBytes > 0 {
			sc.SegmentBytes = cfg.SpillSegmentBytes
		}
		sc.CompactBelow, sc.CompactBytesPerSec = cfg.SpillCompactBelow, cfg.SpillCompactRate
		sc.Logger, sc.Undo = s.log, made
		sc.DeferCompaction = true // started once the arena is mapped: a refusal leaves the segments as they were
		// The segments a crash left without hint files are read after the
		// service listens (start.go).
		sc.ScanInBackground = true
		if h := cfg.hooks; h != nil {
			sc.OnScan = h.spillScanned
		}
		if s.spill, err = spill.New(sc); err != nil {
			return nil, errors.Join(fmt.Errorf("spill directory (--spill-dir): %w", err), s.closeAdminListener(), s.ln.Close())
		}
	}
	ac := arena.DefaultConfig(cfg.ArenaBytes)
	ac.HighWatermark, ac.LowWatermark = cfg.HighWatermark, cfg.LowWatermark
	ac.Allocator, ac.Logger = cfg.Allocator, s.log
	ac.OnEvict = s.spillOne
	ac.File = cfg.ArenaFile
	if h := cfg.hooks; h != nil && h.warmed != nil {
		ac.OnWarmup = h.warmed
	}
	s.arena, err = arena.New(ac)
	if err != nil && ac.File != "" && cfg.ArenaFileFallback && errors.Is(err, arena.ErrFile) {
		s.log.Warn("the arena file cannot be used: the arena is anonymous memory, and a restart starts it empty",
			"file", ac.File, "err", err, "fix", "point --arena-file at a tmpfs that holds the arena (e.g. /dev/shm), or pass --arena-file '' to say anonymous")
		ac.File = ""
		s.arena, err = arena.New(ac)
	}
	if err != nil {
		what := "arena (--arena)"
		if errors.Is(err, arena.ErrFile) || errors.Is(err, arena.ErrLocked) {
			what = "arena file (--arena-file)"
		}
		return nil, errors.Join(fmt.Errorf("%s: %w", what, err), s.closeAdminListener(), s.ln.Close(), s.closeSpill())
	}
	if s.spill != nil {
		s.spill.StartCompaction()
	}
	if len(cfg.RemoteAddrs) > 0 {
		s.remote = newRemoteTier(s, rc, cfg.OpenRemote)
	}
	if s.adminLn != nil {
		s.serveAdmin()
	}
	s.listeningAfter = time.Since(s.started)
	s.wg.Add(2)
	go s.accept()
	go s.watchReady()
	st := s.arena.Stats().Recovery
	s.log.Info("node service listening", "socket", cfg.Socket, "admin", s.AdminAddr(), "arena", cfg.ArenaBytes, "arenaFile", st.File,
		"warm", st.Warm, "cold", st.Cold, "starts", st.Starts, "spill", cfg.SpillDir, "remote", cfg.RemoteAddrs, "after", s.listeningAfter.Round(time.Microsecond))
	return s, nil
}

// probeSpillDir creates the spill directory if it is missing (recorded in
// made) and creates and removes a file in it: a directory the service cannot
// write would otherwise be accepted and fail (and log) once per evicted object.
func probeSpillDir(dir string, made *undo.Log) error {
	if err := made.MkdirAll(dir, 0o700); err != nil { // private: node/spill refuses a directory others can read
		return fmt.Errorf("spill directory %s: cannot create it (%v); create it, or point --spill-dir at a directory this user can write: %w", dir, err, ErrConfig)
	}
	f, err := os.CreateTemp(dir, ".strata-probe-*")
	if err != nil {
		return fmt.Errorf("spill directory %s is not writable (%v); give this user write permission, or point --spill-dir at a directory it can write: %w", dir, err, ErrConfig)
	}
	name := f.Name()
	if err := errors.Join(f.Close(), os.Remove(name)); err != nil {
		return fmt.Errorf("spill directory %s: cannot remove the probe file %s (%v); check the directory's permissions: %w", dir, name, err, ErrConfig)
	}
	return nil
}

func (s *Server) closeRemote() {
	if s.remote != nil {
		s.remote.close()
	}
}

func (s *Server) closeSpill() error {
	if s.spill == nil {
		return nil
	}
	return s.spill.Close()
}

// AdminAddr is the admin port's address ("" when it is off).
func (s *Server) AdminAddr() string {
	if s.adminLn == nil {
		return ""
	}
	return s.adminLn.Addr().String()
}

// Socket is the socket path.
func (s *Server) Socket() string { return s.cfg.Socket }

// Close stops accepting, ends every client's connection, waits for requests in
// flight (ShutdownTimeout at most; then they are failed and their connections
// closed), and releases the arena (an arena file is left marked clean for the
// next service) and the spill store (its buffers written out).
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	sessions := make([]*session, 0, len(s.sessions))
	for _, c := range s.sessions {
		sessions = append(sessions, c)
	}
	s.mu.Unlock()
	errs := []error{s.ln.Close()}
	if s.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		errs = append(errs, s.admin.Shutdown(ctx))
		cancel()
	}
	// The sessions close their connections once their requests end: a client
	// that sees its connection closed knows the service copies nothing more
	// into its memory (window.go).
	for _, c := range sessions {
		_ = c.conn.CloseRead()
	}
	ended := make(chan struct{})
	go func() { s.wg.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(s.cfg.ShutdownTimeout):
		s.log.Warn("shutting down: requests still in flight after the shutdown timeout are failed (--shutdown-timeout)",
			"timeout", s.cfg.ShutdownTimeout, "clients", len(sessions))
		s.stopRequests()
		for _, c := range sessions {
			_ = c.conn.Close()
		}
		select {
		case <-ended:
		case <-time.After(s.cfg.RequestTimeout):
			// A request stuck in a system call (a hung spill device) cannot
			// be interrupted: the process exits around it.
			s.log.Error("shutting down with requests still running", "waited", s.cfg.ShutdownTimeout+s.cfg.RequestTimeout)
			errs = append(errs, fmt.Errorf("close: requests still running after %v: %w", s.cfg.ShutdownTimeout+s.cfg.RequestTimeout, ErrShutdown))
		}
	}
	s.stopRequests()
	s.closeRemote()
	errs = append(errs, s.arena.Close(), s.closeSpill())
	return errors.Join(errs...)
}

// spillOne is the arena's eviction hook: append the object to the spill (a
// copy into its write buffer, for all but the largest objects; it is readable
// from the spill when this returns).
func (s *Server) spillOne(obj arena.Evicted) bool {
	if s.spill == nil {
		return false
	}
	if h := s.cfg.hooks; h != nil && h.spilling != nil {
		h.spilling(obj.Key)
	}
	ctx, cancel := context.WithTimeout(s.life, s.cfg.RequestTimeout)
	defer cancel()
	if err := s.spill.PutObject(ctx, obj.Key, storage.Format(obj.Format), obj.Bytes); err != nil {
		s.st.spillErrors.Add(1)
		s.log.Warn("spill of an evicted object failed; it is dropped", "key", obj.Key, "err", err)
		return false
	}
	return true
}

func serverVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		return "strata " + info.Main.Version
	}
	return "strata"
}
