package node

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"
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
		if errors.Is(err, unix.EADDRINUSE) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.EADDRNOTAVAIL) {
			// A configuration that cannot work here (exit 2): the same
			// start fails the same way until the port is freed or changed.
			return fmt.Errorf("admin port %s (--admin): %v; another strata serve or program holds it: stop it, or give "+
				"--admin a free loopback port (127.0.0.1:0 picks one, --admin '' turns the admin port off) and point "+
				"Prometheus at it (deploy/prometheus/strata.yml scrapes 127.0.0.1:9470): %w", s.cfg.Admin, err, ErrConfig)
		}
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
			st := s.adminStats(r)
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

// adminStats is the /stats document for the caller of r. The admin port has
// no authentication and any local user can reach loopback, so with
// --admin-stats=full it asks the kernel which user owns the caller's socket
// (peerUID) and applies the rule of the Stats message on the node socket
// (Server.statsFor): the service's own user, its tenant group and root see
// every client; another user sees its own tenant's clients and the service's
// totals, never another tenant's names, pids, uids or pools. A caller the
// kernel cannot name gets the totals only (the counts view): the default must
// not give one tenant's identities to another. --admin-stats=counts serves
// everyone the totals.
func (s *Server) adminStats(r *http.Request) Stats {
	if s.cfg.AdminStats == AdminStatsCounts {
		return s.Stats().counts()
	}
	uid, err := peerUID(r)
	if err != nil {
		s.logs.info("admin /stats: the caller's user is unknown, so it gets the totals only (--admin-stats=counts view)", "err", err)
		return s.Stats().counts()
	}
	viewer := &session{uid: uid, uidKnown: true, ns: s.tenants.namespace(uid, true, 0)}
	if s.seesEveryone(viewer) {
		return s.Stats()
	}
	return s.statsFor(viewer)
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

// peerUID returns the user that owns the caller's end of r's connection: the
// loopback counterpart of SO_PEERCRED, which TCP does not have. Only the
// kernel's word counts, as on the node socket: the request says nothing about
// who sent it.
func peerUID(r *http.Request) (int, error) {
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return 0, errors.New("the request has no local address")
	}
	server, err := netip.ParseAddrPort(local.String())
	if err != nil {
		return 0, fmt.Errorf("admin port address %q: %w", local, err)
	}
	client, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return 0, fmt.Errorf("caller address %q: %w", r.RemoteAddr, err)
	}
	return tcpOwner(client, server)
}

// Lengths of the kernel's struct inet_diag_req_v2 and struct inet_diag_msg
// (linux/inet_diag.h), which golang.org/x/sys/unix does not define.
const (
	inetDiagReqLen = 56
	inetDiagMsgLen = 72
)

// tcpOwner asks the kernel's socket diagnostics (NETLINK_SOCK_DIAG, what ss
// reads; no privilege needed) for the uid that owns the TCP socket whose local
// end is client and remote end is server: the caller's socket, not the
// service's own end of the connection, which the reply's addresses confirm.
func tcpOwner(client, server netip.AddrPort) (int, error) {
	ca, sa := client.Addr().Unmap(), server.Addr().Unmap()
	if ca.Is4() != sa.Is4() {
		return 0, fmt.Errorf("caller %v and admin port %v are of different address families", client, server)
	}
	family := byte(unix.AF_INET6)
	if ca.Is4() {
		family = unix.AF_INET
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, fmt.Errorf("socket diagnostics: %w", err)
	}
	defer unix.Close(fd)
	// The kernel answers at once; the bound is for a kernel that never does.
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 1}); err != nil {
		return 0, fmt.Errorf("socket diagnostics: %w", err)
	}
	ne := binary.NativeEndian
	req := make([]byte, unix.NLMSG_HDRLEN+inetDiagReqLen)
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(req[8:], 1) // sequence number
	b := req[unix.NLMSG_HDRLEN:]
	b[0], b[1] = family, unix.IPPROTO_TCP
	ne.PutUint32(b[4:], ^uint32(0)) // in any state
	putSockID(b[8:], ca, client.Port(), sa, server.Port())
	// The cookie, two words: INET_DIAG_NOCOOKIE.
	ne.PutUint32(b[48:], ^uint32(0))
	ne.PutUint32(b[52:], ^uint32(0))
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("socket diagnostics: %w", err)
	}
	buf := make([]byte, 8<<10)
	n, err := recvRetry(fd, buf)
	if err != nil {
		return 0, fmt.Errorf("socket diagnostics: %w", err)
	}
	want := make([]byte, 48)
	putSockID(want, ca, client.Port(), sa, server.Port())
	for msgs := buf[:n]; len(msgs) >= unix.NLMSG_HDRLEN; {
		l, typ := int(ne.Uint32(msgs[0:])), ne.Uint16(msgs[4:])
		if l < unix.NLMSG_HDRLEN || l > len(msgs) {
			return 0, fmt.Errorf("socket diagnostics for %v: a reply of %d bytes holds a message of %d", client, len(msgs), l)
		}
		d := msgs[unix.NLMSG_HDRLEN:l]
		msgs = msgs[min(len(msgs), (l+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1)):]
		switch typ {
		case unix.NLMSG_ERROR:
			if len(d) >= 4 {
				if e := int32(ne.Uint32(d)); e < 0 {
					return 0, fmt.Errorf("socket diagnostics for %v: %w", client, unix.Errno(-e))
				}
			}
		case unix.SOCK_DIAG_BY_FAMILY:
			// The reply names the socket it describes: the caller's end (its
			// ports, addresses; the interface and cookie are not compared).
			if len(d) < inetDiagMsgLen || d[0] != family || !bytes.Equal(d[4:4+36], want[:36]) {
				return 0, fmt.Errorf("socket diagnostics for %v answered for another socket", client)
			}
			return int(ne.Uint32(d[64:])), nil
		}
	}
	return 0, fmt.Errorf("socket diagnostics for %v: no answer", client)
}

// putSockID writes struct inet_diag_sockid's ports and addresses (network
// order) for the socket from src to dst, and no interface.
func putSockID(b []byte, src netip.Addr, sport uint16, dst netip.Addr, dport uint16) {
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	s, d := src.AsSlice(), dst.AsSlice()
	clear(b[4:40])
	copy(b[4:20], s)
	copy(b[20:36], d)
}

// recvRetry reads one datagram from fd, again when a signal interrupted it.
func recvRetry(fd int, buf []byte) (int, error) {
	for range 8 {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != unix.EINTR {
			return n, err
		}
	}
	return 0, unix.EINTR
}
