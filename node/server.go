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
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

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

// New starts a service: it checks the spill directory (creating it, and
// creating and removing a file in it), listens on the socket (and the admin
// port), and only then maps the arena, so that a refusal costs no memory; it
// accepts clients until Close. It returns within milliseconds whatever the
// arena's size: the arena warms its memory, and recovers the objects of its
// arena file, in the background (start.go).
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
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
	if cfg.SpillDir != "" {
		if err := probeSpillDir(cfg.SpillDir); err != nil {
			return nil, err
		}
		sc := spill.DefaultConfig(cfg.SpillDir)
		sc.CapacityBytes = cfg.SpillBytes
		if cfg.SpillSegmentBytes > 0 {
			sc.SegmentBytes = cfg.SpillSegmentBytes
		}
		sc.CompactBelow, sc.CompactBytesPerSec = cfg.SpillCompactBelow, cfg.SpillCompactRate
		sc.Logger = s.log
		if s.spill, err = spill.New(sc); err != nil {
			return nil, fmt.Errorf("spill directory (--spill-dir): %w", err)
		}
	}
	// Until the accept loop starts, engines that connect wait in the backlog.
	if s.ln, err = wire.Listen(cfg.Socket, cfg.SocketMode, gid); err != nil {
		return nil, errors.Join(fmt.Errorf("socket (--socket): %w", err), s.closeSpill())
	}
	if cfg.Admin != "" {
		if err := s.listenAdmin(); err != nil {
			return nil, errors.Join(err, s.ln.Close(), s.closeSpill())
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

// probeSpillDir creates the spill directory if it is missing and creates and
// removes a file in it: a directory the service cannot write would otherwise be
// accepted and fail (and log) once per evicted object.
func probeSpillDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
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

func (s *Server) accept() {
	defer s.wg.Done()
	var backoff time.Duration
	for {
		uc, err := s.ln.AcceptUnix()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			if !temporaryAccept(err) {
				s.acceptErr.Store(&acceptFailure{err: err, at: time.Now(), fatal: true})
				s.log.Error("accept on the node socket failed; no new clients", "err", err)
				return
			}
			// Out of descriptors or memory: the clients already connected keep
			// working, and new ones are accepted again once some are freed.
			// Stopping here would lock every new client out for good.
			s.acceptErr.Store(&acceptFailure{err: err, at: time.Now()})
			s.st.acceptErrors.Add(1)
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.logs.warn("accept on the node socket failed; retrying (raise the descriptor limit, ulimit -n, or lower --max-clients and --max-segments-per-client)",
				"err", err, "retry_in", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-s.done:
				t.Stop()
				return
			}
			continue
		}
		backoff = 0
		s.acceptErr.Store(nil)
		s.admit(uc)
	}
}

// temporaryAccept reports whether an accept error passes: the service ran out
// of descriptors or memory, or the connection went away before it was accepted.
func temporaryAccept(err error) bool {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return false
	}
	switch errno {
	case syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.EINTR, syscall.EPROTO, syscall.EPERM:
		return true
	}
	return false
}

// admit starts a session for a new connection, or answers busy and closes it
// when the service or the peer's user has all the connections it may have.
func (s *Server) admit(uc *net.UnixConn) {
	c := &session{srv: s, conn: wire.NewConn(uc), segments: map[uint32]*segment{}, uid: -1}
	if pid, uid, _, err := c.conn.PeerCred(); err == nil {
		c.pid, c.uid = pid, uid
	}
	perUID := s.cfg.MaxClientsPerUID
	if perUID == 0 {
		perUID = s.cfg.MaxClients
	}
	s.mu.Lock()
	var why string
	switch {
	case s.closed:
	case len(s.sessions) >= s.cfg.MaxClients:
		why = fmt.Sprintf("the node service has its %d clients; raise --max-clients", s.cfg.MaxClients)
	case s.perUID[c.uid] >= perUID:
		why = fmt.Sprintf("user %d has its %d connections to the node service; close idle ones or raise --max-clients-per-uid", c.uid, perUID)
	}
	if s.closed || why != "" {
		s.mu.Unlock()
		if why != "" {
			s.st.rejected.Add(1)
			s.logs.warn("connection refused", "uid", c.uid, "pid", c.pid, "reason", why)
			// A short bound: the accept loop must not wait on a client that does
			// not read.
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = c.conn.Send(ctx, wire.TypeError, 0, wire.Error{Code: wire.Busy, Message: why})
			cancel()
		}
		_ = c.conn.Close()
		return
	}
	c.id = s.nextID.Add(1)
	s.sessions[c.id] = c
	s.perUID[c.uid]++
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		c.serve()
		s.mu.Lock()
		delete(s.sessions, c.id)
		if s.perUID[c.uid]--; s.perUID[c.uid] <= 0 {
			delete(s.perUID, c.uid)
		}
		s.mu.Unlock()
	}()
}

// acceptFailure is a failed accept on the socket.
type acceptFailure struct {
	err   error
	at    time.Time
	fatal bool // the accept loop stopped
}

// acceptFailureFresh is how long a failed accept makes the service unhealthy.
// While descriptors stay exhausted and a client waits, accept fails again at
// least every second (the backoff's bound); a failure older than this was for
// a client that went away, and the next client may well be accepted.
const acceptFailureFresh = 5 * time.Second

// health reports why the service is not healthy, or nil.
func (s *Server) health() error {
	if f := s.acceptErr.Load(); f != nil && (f.fatal || time.Since(f.at) < acceptFailureFresh) {
		return fmt.Errorf("the node socket cannot accept new clients: %w", f.err)
	}
	return nil
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

// listenAdmin checks the admin address and listens on it; serveAdmin serves
// it once the service is built.
func (s *Server) listenAdmin() error {
	host, _, err := net.SplitHostPort(s.cfg.Admin)
	if err != nil {
		return fmt.Errorf("admin address %q (--admin): %v: %w", s.cfg.Admin, err, ErrConfig)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("admin address %q (--admin) is not loopback: the admin port has no authentication, bind it to 127.0.0.1 or ::1: %w", s.cfg.Admin, ErrConfig)
	}
	if s.adminLn, err = net.Listen("tcp", s.cfg.Admin); err != nil {
		return fmt.Errorf("admin port (--admin): %w", err)
	}
	return nil
}

func (s *Server) closeAdminListener() error {
	if s.adminLn == nil {
		return nil
	}
	return s.adminLn.Close()
}

func (s *Server) serveAdmin() {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(s))
	mux := http.NewServeMux()
	// /healthz is liveness: 200 while the service serves (a starting one
	// does), with its start state in words; /readyz is readiness: 503 while
	// it is starting.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.health(); err != nil {
			http.Error(w, "unhealthy: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		if st := s.startStats(s.arena.Stats()); st.State != StateReady {
			_, _ = io.WriteString(w, "ok: "+st.Message+"\n")
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.health(); err != nil {
			http.Error(w, "unhealthy: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		if st := s.startStats(s.arena.Stats()); st.State != StateReady {
			http.Error(w, st.Message, http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	if s.cfg.AdminStats != AdminStatsOff {
		mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
			st := s.Stats()
			if s.cfg.AdminStats == AdminStatsCounts {
				st = st.counts()
			}
			w.Header().Set("Content-Type", "application/json")
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			_ = enc.Encode(st)
		})
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	s.admin = &http.Server{Handler: loopbackHost(mux), ReadHeaderTimeout: 5 * time.Second}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.admin.Serve(s.adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("admin port stopped", "err", err)
		}
	}()
}

// loopbackHost serves only requests whose Host names the loopback interface:
// a web page the operator's browser opens elsewhere could otherwise reach the
// admin port through DNS rebinding (a name of the attacker's that resolves to
// 127.0.0.1), and read /stats.
func loopbackHost(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if hh, _, err := net.SplitHostPort(host); err == nil {
			host = hh
		}
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
		ip := net.ParseIP(host)
		if !strings.EqualFold(host, "localhost") && (ip == nil || !ip.IsLoopback()) {
			http.Error(w, fmt.Sprintf("Host %q is not a loopback name: the admin port serves only localhost, 127.0.0.1 and ::1", r.Host), http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func serverVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		return "strata " + info.Main.Version
	}
	return "strata"
}
