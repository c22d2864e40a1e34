package sim

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stratakv/strata/hicache"
)

// The default trace leaves cached conversations in the middle of pages
// (regenerated answers, edited messages, agents' branches), so a cache whose
// match ends one page too late where a request diverges inside a cached span
// serves wrong KV, and the default bench's verification reports it. A trace that
// only ever extends conversations at page boundaries would not notice.
func TestDefaultTraceCatchesAnOverlongMatch(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Runs = []string{RunStrata}
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.faults = &hicache.Faults{OverlongMatch: true}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Workload != "multiturn" {
		t.Fatalf("default workload %q", rep.Workload)
	}
	if st := rep.Runs[0]; st.CorruptPages == 0 {
		t.Fatalf("the default bench with a match one page too long reported no corrupt pages (%d verified)", st.VerifiedPages)
	}
}
