package sim

import (
	"bytes"
	"fmt"
	"text/tabwriter"
	"time"
)

// writeRestart writes the restart experiment's section: when the service was
// restarted and how, how long it was unreachable, what the restarted service
// kept, the L3 hits before, during and after, and the ratio the experiment is
// for, on one line that says its goal.
func (r *Report) writeRestart(buf *bytes.Buffer) {
	rs := r.Restart
	if rs == nil {
		return
	}
	how := map[string]string{RestartKill: "SIGKILL, restarted on its arena file", RestartTerm: "SIGTERM (clean shutdown), restarted on its arena file",
		RestartCold: "SIGKILL, restarted without its arena file (cold)"}[rs.Mode]
	buf.WriteString("\nrestart of the node service (--restart-node " + rs.Mode + ")\n")
	tw := tabwriter.NewWriter(buf, 0, 0, 2, ' ', 0)
	pct := 0.0
	if r.Requests > 0 {
		pct = 100 * float64(rs.AtRequest) / float64(r.Requests)
	}
	fmt.Fprintf(tw, "  when\t%s run, after %d of %d requests (%.0f%%): %s\n", rs.Run, rs.AtRequest, r.Requests, pct, how)
	fmt.Fprintf(tw, "  unreachable\t%s from the signal to the restarted service's first answer; ready (start over) after %s\n",
		formatMillisDuration(rs.Down), formatMillisDuration(rs.Ready))
	fmt.Fprintf(tw, "  held\tengines waited up to %s at %.0f%% of their requests for their L3 client to reconnect, so that the restart ends inside the run (wall time, not in TTFT)\n",
		formatMillisDuration(rs.Held), 100*rs.HoldAt)
	start := "cold (" + rs.ColdReason + ")"
	if rs.Warm {
		start = "warm"
	}
	fmt.Fprintf(tw, "  objects\t%s in the arena before the signal; the restarted service started %s: %s recovered, %d lost (damaged), %d lost in the spill's write buffers; spill %s objects before, %s after\n",
		groupDigits(rs.ObjectsBefore), start, groupDigits(rs.Recovered), rs.Lost, rs.LostEvicted, groupDigits(rs.SpillBefore), groupDigits(rs.SpillAfter))
	fmt.Fprintf(tw, "  restarts\t%d by the bench; the service counts %d on its arena file; previous shutdown clean: %t\n",
		rs.Restarted, rs.ServiceRestarts, rs.PreviousClean)
	fmt.Fprintf(tw, "  L3 hit tokens\t%s with the restart (%s while the service was down, %s after it answered again), %s in %s without; %d refills of %s pages from L2\n",
		groupDigits(rs.L3HitTokens), groupDigits(rs.DownL3HitTokens), groupDigits(rs.AfterL3HitTokens),
		groupDigits(rs.BaselineL3HitTokens), rs.Baseline, rs.Refills, groupDigits(rs.RefillPages))
	fmt.Fprintf(tw, "  after\tfrom %s into the run on: %s L3 hit tokens with the restart, %s without (%.2f)\n",
		formatWall(rs.BackAt), groupDigits(rs.AfterL3HitTokens), groupDigits(rs.BaselineAfterL3HitTokens), rs.AfterRatio)
	_ = tw.Flush()
	fmt.Fprintf(buf, "L3 hit tokens with restart / without = %.2f (goal ≥ %.1f)\n", rs.Ratio, RestartGoal)
}

// formatMillisDuration renders a wall time in milliseconds, to 0.1 ms.
func formatMillisDuration(d Duration) string {
	return fmt.Sprintf("%.1f ms", float64(time.Duration(d))/float64(time.Millisecond))
}
