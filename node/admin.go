package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

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
