package main

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Without --admin, strata serve's metrics are where the shipped Prometheus
// config scrapes them and where serve.json puts them, at every restart.
func TestServeAdminDefaultIsWherePrometheusScrapes(t *testing.T) {
	raw, err := os.ReadFile(scrapeConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"`+defaultAdmin+`"`) {
		t.Errorf("%s does not scrape %s, strata serve's default admin port", scrapeConfigPath, defaultAdmin)
	}
	if got := newServeSettings().cfg.Admin; got != defaultAdmin {
		t.Errorf("serve's default admin %q, want %q", got, defaultAdmin)
	}
	if example := loadServeConfig(t, []string{"--config", exampleConfig}); example.Admin != defaultAdmin {
		t.Errorf("serve.json's admin %q, want the default %q", example.Admin, defaultAdmin)
	}
}

// When the default port is taken (a second service on the node, another
// program), serve refuses at start with exit 2 and says how to choose,
// leaving no socket behind; it never moves to a port Prometheus does not
// scrape.
func TestServeAdminPortTakenIsRefusedWithTheFix(t *testing.T) {
	ln, err := net.Listen("tcp", defaultAdmin)
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		// Taken already (another service on this machine): the same case.
	case err != nil:
		t.Fatalf("listen %s: %v", defaultAdmin, err)
	default:
		defer ln.Close()
	}
	sock := filepath.Join(t.TempDir(), "s.sock")
	code, errs := runServeCLI(t, "--admin", defaultAdmin, "--socket", sock, "--arena", "8MiB", "--arena-file", "")
	if code != exitUsage {
		t.Fatalf("exit %d, want %d:\n%s", code, exitUsage, errs)
	}
	for _, want := range []string{defaultAdmin, "127.0.0.1:0 picks one", "--admin ''"} {
		if !strings.Contains(errs, want) {
			t.Errorf("the refusal does not say %q:\n%s", want, errs)
		}
	}
	if _, err := os.Lstat(sock); err == nil {
		t.Errorf("the refused start left its socket %s", sock)
	}
}
