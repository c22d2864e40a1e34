package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node"
	"github.com/stratakv/strata/node/wire"
)

func runInspect(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("inspect", stdout)
	socket := fs.String("socket", "/run/strata/strata.sock", "the node service's socket")
	asJSON := fs.Bool("json", false, "print the service's stats document as JSON")
	timeout := fs.Duration("timeout", 5*time.Second, "give up after this long")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *timeout <= 0 {
		return usagef("--timeout %v: want a positive duration, e.g. 5s", *timeout)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	st, raw, err := fetchStats(ctx, *socket)
	if err != nil {
		return err
	}
	if *asJSON {
		// Indented as the service wrote it: decoding into any would make
		// every number a float64 and round 64-bit ids (the content id
		// operators compare across restarts) to 17 digits.
		var pretty bytes.Buffer
		if err := json.Indent(&pretty, raw, "", "  "); err != nil {
			return fmt.Errorf("the node service's stats document is not JSON (%v): upgrade strata serve to this strata's release", err)
		}
		pretty.WriteByte('\n')
		_, err := stdout.Write(pretty.Bytes())
		return err
	}
	return writeInspect(stdout, st)
}

// fetchStats asks the service at socket for its stats document.
func fetchStats(ctx context.Context, socket string) (node.Stats, []byte, error) {
	var st node.Stats
	conn, err := wire.Dial(ctx, socket)
	if err != nil {
		// wire.Dial's error names the socket already.
		return st, nil, fmt.Errorf("%w (is `strata serve --socket %s` running?)", err, socket)
	}
	defer conn.Close()
	call := func(id uint64, t wire.Type, msg wire.Message) (wire.Message, error) {
		if err := conn.Send(ctx, t, id, msg); err != nil {
			return nil, err
		}
		_, m, _, err := conn.Recv(ctx)
		if err != nil {
			return nil, err
		}
		if e, ok := m.(*wire.Error); ok {
			return nil, e.Err()
		}
		return m, nil
	}
	if _, err := call(1, wire.TypeHello, wire.Hello{Version: wire.Version, ClientName: "strata-inspect"}); err != nil {
		return st, nil, fmt.Errorf("hello: %w", err)
	}
	m, err := call(2, wire.TypeStats, wire.Stats{})
	if err != nil {
		return st, nil, fmt.Errorf("stats: %w", err)
	}
	raw := m.(*wire.StatsReply).JSON
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, nil, fmt.Errorf("stats document: %w", err)
	}
	return st, raw, nil
}

func writeInspect(w io.Writer, st node.Stats) error {
	fb := func(n int64) string { return hostmem.FormatBytes(n) }
	fmt.Fprintf(w, "node service %s  socket %s  admin %s  up %s\n", st.Version, st.Socket, st.Admin, st.Uptime.Round(time.Second))
	fmt.Fprintf(w, "start   %s\n\n", formatStart(st.Start))
	a := st.Arena
	fmt.Fprintf(w, "arena   %s of %s used (%.0f%%), %d objects (%s held, %d slabs, index %s off-heap), %d leased, fragmentation %.2f, evicted %d (spilled %d, dropped %d)\n",
		fb(a.UsedBytes), fb(a.SizeBytes), 100*float64(a.UsedBytes)/float64(max(a.SizeBytes, 1)), a.Objects, fb(a.HeldBytes), a.Slabs, fb(a.IndexBytes),
		a.LeasedObjects, a.Fragmentation, a.Evictions, a.Spilled, a.Dropped)
	if s := st.Spill; s != nil {
		capacity := fb(s.CapacityBytes)
		if s.ConfiguredCapacityBytes > s.CapacityBytes {
			capacity += fmt.Sprintf(" (the device's room; --spill-capacity %s)", fb(s.ConfiguredCapacityBytes))
		}
		fmt.Fprintf(w, "spill   %s of %s, %d objects in %d segment files, %d corrupt removed (%d for good), %d failed writes (evicted objects dropped)%s\n",
			fb(s.Bytes), capacity, s.Objects, s.Files, s.CorruptRemoved, s.CorruptDropped, st.Ops.SpillErrors, formatFaults(s.Faults))
		fmt.Fprintf(w, "        %s live, %s dead; %d compactions (%s compacted, %s of it copied)\n",
			fb(s.LiveBytes), fb(s.DeadBytes), s.Compactions, fb(s.CompactedBytes), fb(s.CompactCopiedBytes))
		if s.RemovesNotDurable > 0 {
			fmt.Fprintf(w, "        %d removes that may not survive a restart (their tombstones could not be written)\n", s.RemovesNotDurable)
		}
	} else {
		fmt.Fprintln(w, "spill   none (evicted objects are dropped)")
	}
	if r := st.Remote; r != nil {
		fmt.Fprintf(w, "remote  Redis %s: connected %v, %d written (%d failed, %d dropped, %s queued), %d hits, %d misses, %d faults\n",
			strings.Join(r.Addrs, ","), r.Connected, r.Written, r.WriteFailed, r.Dropped, fb(r.QueuedBytes), r.Hits, r.Misses, r.Faults)
	}
	o := st.Ops
	fmt.Fprintf(w, "ops     %d puts (%d objects, %s, %d already stored), %d gets: hit ratio %.1f%% (arena %d, spill %d, miss %d), %d promotions\n",
		o.Puts, o.PutObjects, fb(o.PutBytes), o.PutSkipped, o.Gets, 100*o.HitRatio, o.ArenaHits, o.SpillHits, o.Misses, o.Promotions)
	fmt.Fprintf(w, "refused %d bad ranges, %d no space, %d corrupt, %d registrations, %d malformed\n\n", o.BadRanges, o.NoSpace, o.Corrupt, o.Refused, o.Malformed)
	if st.Scope == node.ScopeTenant {
		fmt.Fprintf(w, "clients of your tenant only (%d); run as the service's user to see every client\n", st.ClientCount)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "client\tname\tpid\tregistered\tsegments\trequests\tin\tout")
	for _, c := range st.Clients {
		var segs []string
		for _, s := range c.Segments {
			segs = append(segs, fmt.Sprintf("%d:%s %s", s.ID, s.Name, fb(s.Bytes)))
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%d\t%s\t%s\n", c.ID, c.Name, c.PID, fb(c.RegisteredBytes), strings.Join(segs, ", "), c.Requests, fb(c.BytesIn), fb(c.BytesOut))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, c := range st.Clients {
		for _, r := range c.Refused {
			fmt.Fprintf(w, "client %d (%s): registration refused, that pool runs without L3: %s\n", c.ID, c.Name, r)
		}
	}
	return nil
}

// formatStart says how the service's start went: whether it is ready (or
// how far it is), what it kept of the service before, and how long it took.
func formatStart(s node.StartStats) string {
	var b strings.Builder
	if s.State == node.StateReady {
		fmt.Fprintf(&b, "ready after %s (listening after %s)", s.ReadyAfter.Round(time.Millisecond), s.ListeningAfter.Round(time.Millisecond))
	} else {
		fmt.Fprintf(&b, "%s, serving what is ready (listening after %s)", s.Message, s.ListeningAfter.Round(time.Millisecond))
	}
	switch {
	case s.Warm:
		clean := "killed or crashed"
		if s.PreviousClean {
			clean = "shut down cleanly"
		}
		fmt.Fprintf(&b, "; restart %d on arena file %s (the service before %s): %d objects recovered, %d lost", s.Restarts, s.ArenaFile, clean, s.Recovered, s.Lost)
		if s.Unsealed > 0 {
			fmt.Fprintf(&b, ", %d put just before the kill and dropped unsealed", s.Unsealed)
		}
		if s.LostEvicted > 0 {
			fmt.Fprintf(&b, ", %d evicted to the spill and lost with its write buffers", s.LostEvicted)
		}
	case s.ArenaFile != "":
		fmt.Fprintf(&b, "; arena file %s started empty: %s", s.ArenaFile, s.ColdReason)
		if s.DroppedAtStart > 0 {
			fmt.Fprintf(&b, " (%d objects dropped)", s.DroppedAtStart)
		}
		if s.Restarts > 0 {
			fmt.Fprintf(&b, "; restart %d", s.Restarts)
		}
	default:
		b.WriteString("; anonymous arena: a restart starts it empty (--arena-file on a tmpfs keeps it)")
	}
	return b.String()
}

// formatFaults lists a store's errors by kind (", faults: io 3, timeout 1"), or
// nothing when there were none: the text output shows what --json shows.
func formatFaults(faults map[string]int64) string {
	kinds := make([]string, 0, len(faults))
	for k, n := range faults {
		if n > 0 {
			kinds = append(kinds, k)
		}
	}
	if len(kinds) == 0 {
		return ""
	}
	sort.Strings(kinds)
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s %d", k, faults[k])
	}
	return ", faults: " + strings.Join(parts, ", ")
}
