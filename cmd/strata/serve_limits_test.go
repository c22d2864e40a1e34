package main

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/stratakv/strata/node"
)

// The connection limits of `strata serve` come from flags, the environment and
// the config file like every other setting.
func TestServeConnectionLimitFlags(t *testing.T) {
	t.Setenv(envName("request-memory"), "1GiB")
	s := newServeSettings()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	given := s.flags(fs)
	args := []string{"--max-clients-per-uid", "16", "--max-segments-per-client", "8", "--hello-timeout", "2s",
		"--frame-timeout", "3s", "--idle-timeout", "10m", "--admin-stats", "counts"}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if err := s.load(fs, given()); err != nil {
		t.Fatal(err)
	}
	c := s.cfg
	if c.MaxClientsPerUID != 16 || c.MaxSegmentsPerClient != 8 || c.HelloTimeout != 2*time.Second || c.FrameTimeout != 3*time.Second ||
		c.IdleTimeout != 10*time.Minute || c.AdminStats != node.AdminStatsCounts || c.RequestMemoryBytes != 1<<30 {
		t.Fatalf("settings %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.AdminStats = "names"
	if err := c.Validate(); err == nil {
		t.Fatal("admin stats \"names\" accepted")
	}
}
