package main

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The isolation and Redis settings reach node.Config from flags and from the
// config file alike.
func TestServeIsolationAndRemoteSettings(t *testing.T) {
	s := newServeSettings()
	fs := newFlagSet("serve", io.Discard)
	given := s.flags(fs)
	err := parseFlags(fs, []string{"--tenant-groups", "1000,1001;2000", "--max-registered", "512GiB",
		"--remote-username", "engine", "--remote-password-file", "/etc/strata/redis.pw", "--remote-tls-server-name", "redis.internal"})
	if err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(t.TempDir(), "serve.json")
	if err := os.WriteFile(cfgFile, []byte(`{"remote-tls": true, "remote-tls-ca": "/etc/strata/ca.pem", "tenant-groups": [[3000, 3001], [4000]]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	s.config = cfgFile
	if err := s.load(fs, given()); err != nil {
		t.Fatal(err)
	}
	c := s.cfg
	switch {
	case len(c.TenantGroups) != 2 || !slices.Equal(c.TenantGroups[0], []int{1000, 1001}) || !slices.Equal(c.TenantGroups[1], []int{2000}):
		t.Errorf("tenant groups %v", c.TenantGroups)
	case c.MaxRegisteredBytes != 512<<30:
		t.Errorf("max registered %d", c.MaxRegisteredBytes)
	case c.RemoteUsername != "engine" || c.RemotePasswordFile != "/etc/strata/redis.pw":
		t.Errorf("remote credentials %q %q", c.RemoteUsername, c.RemotePasswordFile)
	case !c.RemoteTLS || c.RemoteTLSCAFile != "/etc/strata/ca.pem" || c.RemoteTLSServerName != "redis.internal":
		t.Errorf("remote TLS %v %q %q", c.RemoteTLS, c.RemoteTLSCAFile, c.RemoteTLSServerName)
	}
	s = newServeSettings()
	fs = newFlagSet("serve", io.Discard)
	given = s.flags(fs)
	s.config = cfgFile
	if err := parseFlags(fs, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.load(fs, given()); err != nil {
		t.Fatal(err)
	}
	if g := s.cfg.TenantGroups; len(g) != 2 || !slices.Equal(g[0], []int{3000, 3001}) || !slices.Equal(g[1], []int{4000}) {
		t.Errorf("tenant groups from the config file: %v", g)
	}
	fs = newFlagSet("serve", io.Discard)
	s = newServeSettings()
	given = s.flags(fs)
	if err := parseFlags(fs, []string{"--tenant-groups", "no-such-user-anywhere"}); err != nil {
		t.Fatal(err)
	}
	if err := s.load(fs, given()); err == nil {
		t.Error("an unknown user in --tenant-groups was accepted")
	}
}

// Bad values of the spill's compaction knobs are refused, naming the flag.
func TestServeSpillCompactionFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--spill-compact-below", "0.95"}, "--spill-compact-below"},
		{[]string{"--spill-compact-rate", "-1"}, "--spill-compact-rate"},
	} {
		args := append([]string{"--socket", filepath.Join(shortDir(t), "s.sock"), "--admin", "127.0.0.1:0"}, c.args...)
		code, errs := runServeCLI(t, args...)
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q", c.args, code, errs)
		}
	}
}
