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
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stratakv/strata/node/arena"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/storage"
	"github.com/stratakv/strata/storage/file"
)

// MaxBatchObjects is the most objects one Put or Get may name (128 pages of up to
// 32 parts each).
const MaxBatchObjects = wire.MaxItems

// Server is a running node service.
type Server struct {
	cfg     Config
	log     *slog.Logger
	arena   *arena.Arena
	spill   *file.Store // nil without a spill directory
	remote  *remoteTier // nil without a remote tier
	ln      *net.UnixListener
	admin   *http.Server
	adminLn net.Listener
	started time.Time

	mu       sync.Mutex
	sessions map[uint64]*session
	closed   bool
	nextID   atomic.Uint64
	wg       sync.WaitGroup

	st counters
}

// New starts a service: it maps the arena, opens the spill directory, listens on
// the socket (and the admin port) and accepts clients until Close.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, sessions: map[uint64]*session{}, started: time.Now()}
	if s.log == nil {
		s.log = slog.Default()
	}
	var err error
	if cfg.SpillDir != "" {
		fc := file.DefaultConfig(cfg.SpillDir)
		fc.CapacityBytes = cfg.SpillBytes
		fc.Sync = false // the spill is a cache: torn files are detected and dropped
		fc.Logger = s.log
		if s.spill, err = file.New(fc); err != nil {
			return nil, fmt.Errorf("spill directory: %w", err)
		}
	}
	ac := arena.DefaultConfig(cfg.ArenaBytes)
	ac.HighWatermark, ac.LowWatermark = cfg.HighWatermark, cfg.LowWatermark
	ac.Allocator, ac.Logger = cfg.Allocator, s.log
	ac.OnEvict = s.spillOne
	if s.arena, err = arena.New(ac); err != nil {
		return nil, errors.Join(fmt.Errorf("arena: %w", err), s.closeSpill())
	}
	gid := -1
	if cfg.SocketGroup != "" {
		if gid, err = lookupGroup(cfg.SocketGroup); err != nil {
			return nil, errors.Join(err, s.arena.Close(), s.closeSpill())
		}
	}
	if len(cfg.RemoteAddrs) > 0 {
		s.remote = newRemoteTier(s)
	}
	if s.ln, err = wire.Listen(cfg.Socket, cfg.SocketMode, gid); err != nil {
		s.closeRemote()
		return nil, errors.Join(fmt.Errorf("socket: %w", err), s.arena.Close(), s.closeSpill())
	}
	if cfg.Admin != "" {
		if err := s.startAdmin(); err != nil {
			s.closeRemote()
			return nil, errors.Join(err, s.ln.Close(), s.arena.Close(), s.closeSpill())
		}
	}
	s.wg.Add(1)
	go s.accept()
	s.log.Info("node service listening", "socket", cfg.Socket, "admin", s.AdminAddr(), "arena", cfg.ArenaBytes, "spill", cfg.SpillDir, "remote", cfg.RemoteAddrs)
	return s, nil
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
// flight, and releases the arena and the spill store.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
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
	for _, c := range sessions {
		_ = c.conn.Close()
	}
	s.wg.Wait()
	s.closeRemote()
	errs = append(errs, s.arena.Close(), s.closeSpill())
	return errors.Join(errs...)
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		uc, err := s.ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if !closed {
				s.log.Error("accept on the node socket failed; no new clients", "err", err)
			}
			return
		}
		c := &session{srv: s, conn: wire.NewConn(uc), segments: map[uint32]*segment{}}
		s.mu.Lock()
		if s.closed || len(s.sessions) >= s.cfg.MaxClients {
			full := !s.closed
			s.mu.Unlock()
			if full {
				_ = c.conn.Send(context.Background(), wire.TypeError, 0, wire.Error{Code: wire.Busy,
					Message: fmt.Sprintf("the node service has its %d clients; raise --max-clients", s.cfg.MaxClients)})
			}
			_ = c.conn.Close()
			continue
		}
		c.id = s.nextID.Add(1)
		s.sessions[c.id] = c
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			c.serve()
			s.mu.Lock()
			delete(s.sessions, c.id)
			s.mu.Unlock()
		}()
	}
}

// spillOne is the arena's eviction hook: write the object to the spill directory.
func (s *Server) spillOne(obj arena.Evicted) bool {
	if s.spill == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.RequestTimeout)
	defer cancel()
	if err := s.spill.PutObject(ctx, obj.Key, storage.Format(obj.Format), obj.Bytes); err != nil {
		s.st.spillErrors.Add(1)
		s.log.Warn("spill of an evicted object failed; it is dropped", "key", obj.Key, "err", err)
		return false
	}
	return true
}

func (s *Server) startAdmin() error {
	host, _, err := net.SplitHostPort(s.cfg.Admin)
	if err != nil {
		return fmt.Errorf("admin address %q: %v: %w", s.cfg.Admin, err, ErrConfig)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("admin address %q is not loopback: the admin port has no authentication, bind it to 127.0.0.1 or ::1: %w", s.cfg.Admin, ErrConfig)
	}
	if s.adminLn, err = net.Listen("tcp", s.cfg.Admin); err != nil {
		return fmt.Errorf("admin port: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(s))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(s.Stats())
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	s.admin = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.admin.Serve(s.adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("admin port stopped", "err", err)
		}
	}()
	return nil
}

func serverVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		return "strata " + info.Main.Version
	}
	return "strata"
}
