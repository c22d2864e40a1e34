package sim

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node"
)

// startTestNode runs a node service on socket with a small arena, as a
// user's own `strata serve --socket` would be.
func startTestNode(t *testing.T, socket string) *node.Server {
	t.Helper()
	nc := node.DefaultConfig(socket)
	nc.Admin, nc.ArenaBytes = "", 64<<20
	nc.Logger = slog.New(slog.DiscardHandler)
	ac := hostmem.DefaultConfig(hostmem.Mmap)
	ac.ReserveBytes, ac.Logger = 0, nc.Logger
	alloc, err := hostmem.New(ac)
	if err != nil {
		t.Fatal(err)
	}
	nc.Allocator = alloc
	srv, err := node.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// A node service given by socket goes away inside the strata run and comes
// back: the report counts the lost connection, the reconnect and the calls
// that failed meanwhile, and says how long the L3 was unreachable, where
// the cache's faults alone may say nothing.
func TestReportCountsAnL3Outage(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "s.sock")
	var mu sync.Mutex
	srv := startTestNode(t, socket)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		_ = srv.Close()
	})
	cfg := sequential(smallConfig())
	cfg.Runs, cfg.NodeSocket, cfg.L2Ratio = []string{RunStrata}, socket, 1
	requests := 0
	cfg.watch = func(done int) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case requests == 0 && done >= 8:
			requests = done
			_ = srv.Close() // gone while the next requests are served
		case requests > 0 && done >= requests+6:
			srv = startTestNode(t, socket)
			requests = -1
		}
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if requests != -1 {
		t.Fatalf("the run ended before the service came back (request %d)", requests)
	}
	o := rep.Runs[0].L3.Outage
	if o == nil || o.Disconnects != 1 || o.RefusedCalls+o.LostCalls == 0 || o.Unreachable <= 0 || o.LongestUnreachable <= 0 {
		t.Fatalf("outage %+v", o)
	}
	var buf strings.Builder
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "strata: L3 outage: the node service was unreachable for ") {
		t.Fatalf("no outage line in the report:\n%s", buf.String())
	}
}

// Without an outage the report has no outage line, and the JSON's counts
// are zeros; over several engines the counts add up and the times are the
// longest one engine saw.
func TestOutageLineAndMerge(t *testing.T) {
	if got := describeOutage(&L3Outage{}); got != "" {
		t.Fatalf("no outage: %q", got)
	}
	a := &L3Outage{Disconnects: 1, Reconnects: 1, RefusedCalls: 3, Unreachable: Duration(40 * time.Millisecond), LongestUnreachable: Duration(40 * time.Millisecond)}
	b := &L3Outage{Disconnects: 2, Reconnects: 2, DialFailures: 2, LostCalls: 1, Unreachable: Duration(55 * time.Millisecond), LongestUnreachable: Duration(30 * time.Millisecond)}
	var m *L3Outage
	m = m.add(a).add(b).add(nil)
	want := L3Outage{Disconnects: 3, Reconnects: 3, DialFailures: 2, RefusedCalls: 3, LostCalls: 1,
		Unreachable: Duration(55 * time.Millisecond), LongestUnreachable: Duration(40 * time.Millisecond)}
	if *m != want {
		t.Fatalf("merged %+v, want %+v", *m, want)
	}
	if got := describeOutage(a); !strings.Contains(got, "unreachable for 40.0 ms; 1 connection lost, 1 reconnect, 0 failed attempts") {
		t.Fatalf("one outage: %q", got)
	}
	line := describeOutage(m)
	for _, s := range []string{"unreachable for 55.0 ms in all (longest 40.0 ms)", "3 connections lost, 3 reconnects, 2 failed attempts to connect",
		"3 calls refused while disconnected, 1 call lost in flight"} {
		if !strings.Contains(line, s) {
			t.Fatalf("outage line %q lacks %q", line, s)
		}
	}
}
