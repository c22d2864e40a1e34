package node

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stratakv/strata/internal/redistest"
	"github.com/stratakv/strata/node/wire"
)

// waitWritten waits until s wrote n objects through to Redis.
func waitWritten(t *testing.T, s *Server, n int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for st := s.Stats().Remote; st.Written < n; st = s.Stats().Remote {
		if time.Now().After(deadline) {
			t.Fatalf("the service did not write through: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// putThrough puts one object through s, to be written through to Redis.
func putThrough(t *testing.T, s *Server) {
	t.Helper()
	c := dial(t, s)
	_, seg := c.segment(1 << 20)
	if res := c.batch(wire.TypePut, item("model/with a space:0", seg, 0, 4096)); res[0].Status != wire.OK {
		t.Fatalf("put: %+v", res)
	}
}

// --remote-username and --remote-password-file authenticate with a Redis that
// requires a password: before, the service could not pass credentials at all.
func TestRemoteWithPassword(t *testing.T) {
	redis := redistest.Start(t, "--requirepass", "s3cret", "--user", "engine", "on", ">engpass", "~*", "+@all")
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := start(t, func(c *Config) { c.RemoteAddrs, c.RemotePasswordFile = []string{redis.Addr()}, pw })
	waitRemoteConnected(t, s)
	putThrough(t, s)
	waitWritten(t, s, 1)

	user := filepath.Join(dir, "user")
	if err := os.WriteFile(user, []byte("engpass"), 0o600); err != nil {
		t.Fatal(err)
	}
	u := start(t, func(c *Config) {
		c.RemoteAddrs, c.RemoteUsername, c.RemotePasswordFile = []string{redis.Addr()}, "engine", user
	})
	waitRemoteConnected(t, u)
	putThrough(t, u)
	waitWritten(t, u, 1)

	cfg := DefaultConfig(socketPath(t))
	cfg.RemoteAddrs, cfg.RemotePasswordFile, cfg.Logger = []string{redis.Addr()}, filepath.Join(dir, "missing"), quiet
	cfg.OpenRemote = openTestRedis
	if _, err := New(cfg); !errors.Is(err, ErrConfig) {
		t.Fatalf("a missing password file: %v", err)
	}
}

// writeCerts writes a CA and a server certificate for the name "redis.test"
// (only: no IP address) into dir.
func writeCerts(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "strata test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "redis.test"},
		DNSNames: []string{"redis.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(srvKey)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server.key", "EC PRIVATE KEY", keyDER)
}

// --remote-tls-ca and --remote-tls-server-name reach a Redis that serves TLS
// with a certificate from a private CA, for a name other than the address.
func TestRemoteOverTLS(t *testing.T) {
	dir := t.TempDir()
	ca, cert, key := writeCerts(t, dir)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	redis := redistest.Start(t, "--tls-port", strconv.Itoa(port), "--tls-cert-file", cert, "--tls-key-file", key,
		"--tls-ca-cert-file", ca, "--tls-auth-clients", "no", "--requirepass", "tlspass")
	if _, err := redis.Do("PING"); err == nil {
		t.Log("redis answers PING without AUTH") // requirepass makes it NOAUTH; either way it runs
	}
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("tlspass"), 0o600); err != nil {
		t.Fatal(err)
	}
	tlsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	s := start(t, func(c *Config) {
		c.RemoteAddrs, c.RemotePasswordFile = []string{tlsAddr}, pw
		c.RemoteTLSCAFile, c.RemoteTLSServerName = ca, "redis.test"
	})
	waitRemoteConnected(t, s)
	putThrough(t, s)
	waitWritten(t, s, 1)

	cfg := DefaultConfig(socketPath(t))
	cfg.RemoteAddrs, cfg.RemoteTLSCAFile, cfg.Logger = []string{tlsAddr}, pw, quiet // not a certificate
	cfg.OpenRemote = openTestRedis
	if _, err := New(cfg); !errors.Is(err, ErrConfig) {
		t.Fatalf("a CA file without a certificate: %v", err)
	}
}
