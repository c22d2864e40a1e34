package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/stratakv/strata/internal/atomicfile"
)

// errNilReport reports a method called on a nil *Report; the caller dropped a result.
var errNilReport = errors.New("report is nil")

// WriteTable writes a plain-text summary of the report for a terminal: the trace and
// cache sizes, one row per run, the L3 activity of each run that has L3, and a line
// comparing strata with the l1-only and ceiling runs. Corrupt pages are always called
// out on their own line. The output depends only on the report, so two renders of
// one report are byte-identical.
func (r *Report) WriteTable(w io.Writer) error {
	if r == nil {
		return fmt.Errorf("write table: %w", errNilReport)
	}
	// Render into memory first so a failing writer cannot leave half a table, and so
	// there is one write error to report instead of one per line.
	var buf bytes.Buffer
	r.writeHeader(&buf)
	buf.WriteByte('\n')
	if len(r.Runs) == 0 {
		buf.WriteString("no runs\n")
	} else {
		r.writeRuns(&buf)
		r.writeLegend(&buf)
		r.writeCorrupt(&buf)
		r.writeOverload(&buf)
		r.writeRunNotes(&buf)
		r.writeComparison(&buf)
		r.writeRestart(&buf)
	}
	if _, err := w.Write(trimLineEnds(buf.Bytes())); err != nil {
		return fmt.Errorf("write table of %s report: %w", r.Workload, err)
	}
	return nil
}

func (r *Report) writeHeader(buf *bytes.Buffer) {
	tw := tabwriter.NewWriter(buf, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "workload\t%s (seed %d)\n", r.Workload, r.Seed)
	if r.Scaling != nil {
		fmt.Fprintf(tw, "scaled\t%s\n", r.Scaling.describe())
	}
	model := r.Model
	if r.Draft != "" {
		model += ", draft " + r.Draft
	}
	fmt.Fprintf(tw, "model\t%s\n", model)
	fmt.Fprintf(tw, "page size\t%d tokens\n", r.PageSize)
	fmt.Fprintf(tw, "L1 (device)\t%s\n", r.capacity(r.L1Tokens))
	fmt.Fprintf(tw, "L2 (host)\t%s\n", r.capacity(r.L2Tokens))
	l3 := r.L3
	if l3 == "" {
		l3 = "none"
	}
	switch {
	case r.Redis != "" && r.L3 == L3Redis:
		l3 += " (" + r.Redis + ")"
	case r.Redis != "":
		l3 += ", writing through to Redis (" + r.Redis + ")"
	}
	fmt.Fprintf(tw, "L3\t%s\n", l3)
	if w := r.describeWarmups(); w != "" {
		fmt.Fprintf(tw, "warm-up\t%s\n", w)
	}
	if r.Concurrent > 0 {
		fmt.Fprintf(tw, "replay\tconcurrent: %d goroutines, no wait for copies between requests (hits vary run to run)\n", r.Concurrent)
	}
	fmt.Fprintf(tw, "requests\t%d\n", r.Requests)
	fmt.Fprintf(tw, "prompt tokens\t%s\n", groupDigits(r.PromptTokens))
	fmt.Fprintf(tw, "working set\t%s tokens (distinct whole-page prefixes), %s of them hit again\n",
		groupDigits(r.DistinctPrefixTokens), groupDigits(r.ReusedPrefixTokens))
	if r.Capacity.RequestsPerSecond > 0 && r.Concurrent == 0 {
		fmt.Fprintf(tw, "arrivals\t%.2f requests/s (Poisson): load %.2f of the engine's capacity\n", r.Rate, r.Load)
		fmt.Fprintf(tw, "capacity\t%s\n", r.Capacity.describe(r.MaxRunning, time.Duration(r.PrefillPerToken), time.Duration(r.DecodeStep)))
	}
	fmt.Fprintf(tw, "elapsed\t%s\n", formatWall(r.Elapsed))
	// Flush into a bytes.Buffer cannot fail.
	_ = tw.Flush()
}

// capacity says how many tokens a tier holds and how much of the working set that is,
// which is what decides its hit ratio.
func (r *Report) capacity(tokens int64) string {
	s := groupDigits(tokens) + " tokens"
	switch {
	case r.DistinctPrefixTokens > 0 && r.ReusedPrefixTokens > 0:
		s += fmt.Sprintf(" (%.1f%% of working set, %.1f%% of what is hit again)",
			100*float64(tokens)/float64(r.DistinctPrefixTokens), 100*float64(tokens)/float64(r.ReusedPrefixTokens))
	case r.DistinctPrefixTokens > 0:
		s += fmt.Sprintf(" (%.1f%% of working set)", 100*float64(tokens)/float64(r.DistinctPrefixTokens))
	}
	return s
}

func (r *Report) writeRuns(buf *bytes.Buffer) {
	// Numbers align right so their digits line up. tabwriter aligns every column the
	// same way, so the run names, the one text column, are padded by hand in front of
	// the numeric rows instead.
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "hit ratio\tL1 hit\tL2 hit\tL3 hit\tverified\tcorrupt\tTTFT p50 ms\tTTFT p90 ms\tload-back GB/s\twall\t\n")
	names := []string{"run"}
	for _, run := range r.Runs {
		names = append(names, run.Name)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			formatPercent(run.HitRatio),
			groupDigits(run.HitTokens.L1),
			groupDigits(run.HitTokens.L2),
			groupDigits(run.HitTokens.L3),
			groupDigits(run.VerifiedPages),
			groupDigits(run.CorruptPages),
			formatMillis(run.TTFTms.P50),
			formatMillis(run.TTFTms.P90),
			formatGBps(run.LoadBack),
			formatWall(run.Elapsed))
	}
	_ = tw.Flush()
	nameWidth := 0
	for _, n := range names {
		// fmt pads by runes, so measure in runes.
		nameWidth = max(nameWidth, utf8.RuneCountInString(n))
	}
	i := 0
	for line := range bytes.Lines(table.Bytes()) {
		fmt.Fprintf(buf, "%-*s%s", nameWidth, names[i], line)
		i++
	}
}

// writeLegend says, in two lines, what the columns a reader cannot guess mean.
func (r *Report) writeLegend(buf *bytes.Buffer) {
	buf.WriteString("verified: hit pages checked byte for byte, every pool, against the KV they must hold (corrupt must be 0")
	if _, ok := r.run(RunCeiling); ok {
		buf.WriteString("; the ceiling keeps keys, not bytes: 0")
	}
	buf.WriteString(")\nload-back GB/s: hit pages copied L2 to L1, bytes over the copies' wall time; TTFT: queueing + modelled prefill of missed tokens + measured load\n")
}

// writeCorrupt names every run that served corrupt pages. A corrupt page means strata
// handed the engine wrong KV, which silently degrades output, so it is never folded
// into a table cell where it could be missed.
func (r *Report) writeCorrupt(buf *bytes.Buffer) {
	first := true
	for _, run := range r.Runs {
		if run.CorruptPages > 0 {
			if first {
				buf.WriteByte('\n')
				first = false
			}
			fmt.Fprintf(buf, "CORRUPT PAGES: %s served %d pages whose bytes did not match\n", run.Name, run.CorruptPages)
		}
	}
}

// writeOverload says, in one line, that arrivals outran the engine: the offered
// load is above its modelled capacity, or a run's queue grew over the trace. Its
// TTFT then measures the backlog, and a cache looks worse than it is (a round
// that arrives before the last one was computed finds nothing to hit).
func (r *Report) writeOverload(buf *bytes.Buffer) {
	var grew []string
	var worst *Backlog
	for _, run := range r.Runs {
		if b := run.Backlog; b != nil {
			grew = append(grew, run.Name)
			if worst == nil || b.LastQuarterWaitSeconds > worst.LastQuarterWaitSeconds {
				worst = b
			}
		}
	}
	if r.Capacity.RequestsPerSecond <= 0 || r.Concurrent > 0 || (r.Load < 1 && worst == nil) {
		return
	}
	var b strings.Builder
	b.WriteString("\nOVERLOAD: ")
	if worst != nil {
		fmt.Fprintf(&b, "the queue grew in %s (requests waited %.2f s in the first quarter of the trace, %.2f s in the last, each in the engine %.2f s); ",
			strings.Join(grew, ", "), worst.FirstQuarterWaitSeconds, worst.LastQuarterWaitSeconds, worst.HoldSeconds)
	}
	fmt.Fprintf(&b, "%.2f requests/s offered is %.2fx the engine's modelled capacity of %.2f/s, so TTFT measures the backlog and rounds that arrive before the last one was computed miss; ",
		r.Rate, r.Load, r.Capacity.RequestsPerSecond)
	if r.Load < 1 {
		fmt.Fprintf(&b, "run with a lower --load (default %.1f) or --rate\n", DefaultLoad)
	} else {
		fmt.Fprintf(&b, "run with --load %.1f (the default, without --rate) or a --rate below %.2f\n", DefaultLoad, r.Capacity.RequestsPerSecond)
	}
	buf.WriteString(b.String())
}

// writeRunNotes writes what does not fit a table cell: each run's L3 activity, failed
// requests and recomputed draft pages.
func (r *Report) writeRunNotes(buf *bytes.Buffer) {
	notes := slices.Clone(r.Notes)
	for _, run := range r.Runs {
		if run.L3WarmHitTokens > 0 {
			notes = append(notes, fmt.Sprintf("%s: L3 started warm (--l3-warm): %s L3 hit tokens are pages this run did not compute",
				run.Name, groupDigits(run.L3WarmHitTokens)))
		}
		if run.Failed > 0 {
			notes = append(notes, fmt.Sprintf("%s: %d requests failed (larger than the device pool)", run.Name, run.Failed))
		}
		if run.DraftRecomputePages > 0 {
			notes = append(notes, fmt.Sprintf("%s: %s hit pages recomputed their draft KV (draft pool without L3)",
				run.Name, groupDigits(run.DraftRecomputePages)))
		}
		if run.Concurrency > 0 {
			notes = append(notes, fmt.Sprintf("%s: %d goroutines, at most %d requests in flight at once", run.Name, run.Concurrency, run.MaxInFlight))
		}
		if run.Engines > 1 {
			notes = append(notes, fmt.Sprintf("%s: %d engine processes sharing L3; %s L3 hit tokens were computed by another engine",
				run.Name, run.Engines, groupDigits(run.CrossEngineHitTokens)))
		}
		if run.Nodes > 1 {
			notes = append(notes, fmt.Sprintf("%s: %d node services on one Redis; %s L3 hit tokens were computed on another node (cross-node hits)",
				run.Name, run.Nodes, groupDigits(run.CrossNodeHitTokens)))
		}
		if rm := run.Remote; rm != nil {
			notes = append(notes, fmt.Sprintf("%s: node write-through to Redis: %s objects written, %d failed, %d dropped; %s local misses served by Redis, %s missed there too, %d faults",
				run.Name, groupDigits(rm.Written), rm.WriteFailed, rm.Dropped, groupDigits(rm.Hits), groupDigits(rm.Misses), rm.Faults))
		}
		if run.L3 != nil {
			notes = append(notes, run.Name+": "+describeL3(run.L3))
			if o := describeOutage(run.L3.Outage); o != "" {
				notes = append(notes, run.Name+": "+o)
			}
			if extra := run.L3.PrefetchedTokens - run.HitTokens.L3; extra > 0 {
				// L3 read bytes beside few L3 hits looks like waste; say where they went.
				notes = append(notes, fmt.Sprintf("%s: prefetches fetched %s tokens from L3 into L2; %s were L3 hits of the request that prefetched them, "+
					"the rest count as L2 hits when a later match found them in L2 (that request after it waited for L1 room, or another one) or were evicted unused",
					run.Name, groupDigits(run.L3.PrefetchedTokens), groupDigits(run.HitTokens.L3)))
			}
		}
	}
	if len(notes) == 0 {
		return
	}
	buf.WriteByte('\n')
	for _, n := range notes {
		buf.WriteString(n)
		buf.WriteByte('\n')
	}
}

// describeL3 renders one run's L3 activity as a single line.
func describeL3(l3 *L3Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "L3 %s read %s, wrote %s", l3.Backend, formatBytes(l3.BytesRead), formatBytes(l3.BytesWritten))
	p := l3.Prefetch
	fmt.Fprintf(&b, "; prefetch %d completed, %d timed out, %d below threshold, %d canceled",
		p.Completed, p.TimedOut, p.BelowThreshold, p.Canceled)
	if p.NoRoom > 0 || p.Stale > 0 {
		fmt.Fprintf(&b, ", %d without host room, %d stale (their prefix left L2 while they fetched)", p.NoRoom, p.Stale)
	}
	b.WriteString("; faults ")
	if len(l3.Faults) == 0 {
		b.WriteString("none")
	} else {
		for i, kind := range slices.Sorted(maps.Keys(l3.Faults)) {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s %d", kind, l3.Faults[kind])
		}
	}
	if len(l3.Pools) > 0 {
		b.WriteString("; pools ")
		for i, ps := range l3.Pools {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(ps.Pool)
			if ps.Enabled {
				b.WriteString(": enabled")
				continue
			}
			b.WriteString(": disabled")
			if ps.Reason != "" {
				b.WriteString(" (" + ps.Reason + ")")
			}
		}
	}
	return b.String()
}

// writeComparison writes the line the bench exists for: how much of the gap between
// an L1-only cache and an unbounded one strata closes.
func (r *Report) writeComparison(buf *bytes.Buffer) {
	strata, ok := r.run(RunStrata)
	if !ok {
		return
	}
	var parts []string
	if l1, ok := r.run(RunL1Only); ok {
		parts = append(parts, fmt.Sprintf("vs %s %s (%+.1f points)",
			RunL1Only, formatPercent(l1.HitRatio), roundedPoints(strata.HitRatio)-roundedPoints(l1.HitRatio)))
	}
	if ceiling, ok := r.run(RunCeiling); ok {
		parts = append(parts, fmt.Sprintf("gap to ceiling %.1f points",
			roundedPoints(ceiling.HitRatio)-roundedPoints(strata.HitRatio)))
	}
	if len(parts) == 0 {
		return
	}
	fmt.Fprintf(buf, "\n%s hit ratio %s %s\n", RunStrata, formatPercent(strata.HitRatio), strings.Join(parts, "; "))
}

// run returns the first run called name.
func (r *Report) run(name string) (RunReport, bool) {
	for _, run := range r.Runs {
		if run.Name == name {
			return run, true
		}
	}
	return RunReport{}, false
}

// WriteJSON writes the report as indented JSON to path. It writes a temporary file in
// the same directory and renames it over path, so a reader (a dashboard polling the
// file, a script started right after) sees the old report or the new one, never half.
func (r *Report) WriteJSON(path string) error {
	if r == nil {
		return fmt.Errorf("write report %s: %w", path, errNilReport)
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("write report %s: encode: %w", path, err)
	}
	data = append(data, '\n')
	return atomicfile.Write(path, data)
}

// formatPercent renders a ratio as a percentage with one decimal.
func formatPercent(ratio float64) string {
	return strconv.FormatFloat(100*ratio, 'f', 1, 64) + "%"
}

// roundedPoints is a ratio in percentage points rounded as formatPercent shows it, so
// that differences printed next to the percentages add up.
func roundedPoints(ratio float64) float64 {
	return math.Round(1000*ratio) / 10
}

// formatMillis renders a latency in milliseconds.
func formatMillis(ms float64) string {
	return strconv.FormatFloat(ms, 'f', 1, 64)
}

// formatGBps renders a tier-to-tier bandwidth, or "-" when nothing moved (a 0 would
// read as a measured stall).
func formatGBps(t Traffic) string {
	if t.Bytes == 0 || t.Elapsed <= 0 {
		return "-"
	}
	return strconv.FormatFloat(t.GBps(), 'f', 2, 64)
}

// formatWall renders a wall time to the millisecond: finer digits are noise.
func formatWall(d Duration) string {
	return time.Duration(d).Round(time.Millisecond).String()
}

// formatBytes renders a byte count in binary units ("1.2 GiB").
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	f := float64(n)
	i := -1
	for math.Abs(f) >= unit && i < 5 {
		f /= unit
		i++
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + " " + string("KMGTPE"[i]) + "iB"
}

// groupDigits renders n with thousands separators, which long token counts need to be
// read at a glance.
func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	sign := ""
	if s[0] == '-' {
		sign, s = "-", s[1:]
	}
	if len(s) <= 3 {
		return sign + s
	}
	var b strings.Builder
	b.WriteString(sign)
	head := len(s) % 3
	if head > 0 {
		b.WriteString(s[:head])
	}
	for i := head; i < len(s); i += 3 {
		if b.Len() > len(sign) {
			b.WriteByte(',')
		}
		b.WriteString(s[i : i+3])
	}
	return b.String()
}

// trimLineEnds removes the blanks tabwriter leaves after a short or empty last cell,
// so no line of the table ends in spaces.
func trimLineEnds(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for line := range bytes.Lines(b) {
		trimmed := bytes.TrimRight(line, " \n")
		out = append(out, trimmed...)
		if bytes.HasSuffix(line, []byte("\n")) {
			out = append(out, '\n')
		}
	}
	return out
}
