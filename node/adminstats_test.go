package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node/wire"
)

// adminGetAs fetches path from s's admin port over a TCP connection opened as
// uid, so that the service's socket diagnostics name that user.
func adminGetAs(t *testing.T, s *Server, uid int, path string) (int, string) {
	t.Helper()
	ap := netip.MustParseAddrPort(s.AdminAddr())
	conn := connectAs(t, uid, unix.AF_INET, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()})
	used := false
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			if used {
				return nil, fmt.Errorf("one connection per request")
			}
			used = true
			return conn, nil
		}}}
	resp, err := client.Get("http://" + s.AdminAddr() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Finding B: the admin port's /stats served every tenant's client names,
// pids, uids and pool names to any local user, by default. Now, with the
// default --admin-stats=full, the kernel names the caller: the service's own
// user (and root) see every client, another user only its own tenant and the
// service's totals, as over the socket. /metrics, which names no client, is
// served to everyone.
func TestAdminStatsShowAnotherUserItsOwnTenantOnly(t *testing.T) {
	s := startShared(t, nil)
	root := dial(t, s)
	a, _ := hostmem.New(hostmem.Config{Kind: hostmem.Shm})
	r, err := a.Allocate("test", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if _, err := root.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: uint64(r.Size()), Name: "root-secret-pool"}, r.Fd()); err != nil {
		t.Fatal(err)
	}
	tenant := dialAs(t, s, 4242)
	tenant.segment(1 << 20)
	secrets := []string{"root-secret-pool", t.Name(), `"uid":0`}

	// The service's user (root here) sees everyone: the detailed view.
	code, body := adminGetAs(t, s, 0, "/stats")
	var st Stats
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil || st.Scope != ScopeService || st.ClientCount != 2 || !strings.Contains(body, "root-secret-pool") {
		t.Fatalf("the service's user: %d %v scope %q, %d clients", code, err, st.Scope, st.ClientCount)
	}

	// Another user sees its own client and the service's totals.
	code, body = adminGetAs(t, s, 4242, "/stats")
	st = Stats{}
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil {
		t.Fatalf("another user: %d %v %s", code, err, body)
	}
	if st.Scope != ScopeTenant || st.ClientCount != 1 || len(st.Clients) != 1 || st.Clients[0].UID != 4242 || st.Arena.SizeBytes == 0 {
		t.Fatalf("another user's stats: scope %q, %d clients %+v", st.Scope, st.ClientCount, st.Clients)
	}
	for _, secret := range secrets {
		if strings.Contains(body, secret) {
			t.Errorf("another user's /stats names another tenant: %q in %s", secret, body)
		}
	}
	// A user with no client sees none.
	code, body = adminGetAs(t, s, 4243, "/stats")
	st = Stats{}
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil || st.Scope != ScopeTenant || st.ClientCount != 0 || len(st.Clients) != 0 {
		t.Fatalf("a user with no clients: %d %v %s", code, err, body)
	}
	for _, secret := range append(secrets, `"uid":4242`) {
		if strings.Contains(body, secret) {
			t.Errorf("a user with no clients reads %q in %s", secret, body)
		}
	}

	// A caller the kernel cannot name gets the totals only.
	req := httptest.NewRequest("GET", "/stats", nil)
	if st := s.adminStats(req); st.Clients != nil || st.ClientCount != 2 {
		t.Fatalf("a caller of unknown user: %d clients listed, %d counted", len(st.Clients), st.ClientCount)
	}

	// /metrics stays whole for everyone: aggregate figures, no names.
	code, body = adminGetAs(t, s, 4243, "/metrics")
	if code != 200 || !strings.Contains(body, "strata_node_clients 2") || !strings.Contains(body, "strata_node_registered_bytes 2.097152e+06") {
		t.Fatalf("metrics for another user: %d\n%s", code, body)
	}
	for _, secret := range secrets {
		if strings.Contains(body, secret) {
			t.Errorf("/metrics names a tenant: %q", secret)
		}
	}
}

// The caller's user is the one that owns the client end of the connection,
// over IPv4 and IPv6 loopback: the lookup never names the service's own end,
// and fails, rather than guess, for a connection that does not exist.
func TestTCPOwnerNamesTheCaller(t *testing.T) {
	if unix.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("connects as another uid and needs root; CI runs as root")
		}
		t.Skip("connects as another uid: run as root")
	}
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		t.Run(addr, func(t *testing.T) {
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				t.Skipf("no %s here: %v", addr, err)
			}
			defer ln.Close()
			server := netip.MustParseAddrPort(ln.Addr().String())
			accepted := make(chan net.Conn, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					close(accepted)
					return
				}
				accepted <- c
			}()
			var sa unix.Sockaddr = &unix.SockaddrInet6{Port: int(server.Port()), Addr: server.Addr().As16()}
			domain := unix.AF_INET6
			if server.Addr().Is4() {
				sa, domain = &unix.SockaddrInet4{Port: int(server.Port()), Addr: server.Addr().As4()}, unix.AF_INET
			}
			c := connectAs(t, 4242, domain, sa)
			sc, ok := <-accepted
			if !ok {
				t.Fatal("accept failed")
			}
			defer sc.Close()
			client := netip.MustParseAddrPort(c.LocalAddr().String())
			if uid, err := tcpOwner(client, server); err != nil || uid != 4242 {
				t.Fatalf("owner of the caller's end: %d %v, want 4242", uid, err)
			}
			// The service's own end of the same connection is the service's
			// user's: a lookup that mixed the ends up would name it instead.
			if uid, err := tcpOwner(server, client); err != nil || uid != 0 {
				t.Fatalf("owner of the service's end: %d %v, want 0", uid, err)
			}
			if uid, err := tcpOwner(client, netip.AddrPortFrom(server.Addr(), 0)); err == nil {
				t.Fatalf("a connection that does not exist is owned by %d", uid)
			}
		})
	}
}
