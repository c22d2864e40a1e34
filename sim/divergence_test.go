package sim

import (
	"context"
	"log/slog"
	"testing"

	"sync/atomic"
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
	var served atomic.Int64
	cfg.overlongServed = &served
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Workload != "multiturn" {
		t.Fatalf("default workload %q", rep.Workload)
	}
	t.Logf("the fault served %d wrong pages; the bench found %d corrupt of %d verified", served.Load(), rep.Runs[0].CorruptPages, rep.Runs[0].VerifiedPages)
	if served.Load() == 0 {
		t.Fatal("the default trace never diverged inside a cached span")
	}
	// Every page the fault served is wrong, and verified when it is served;
	// the tree caches it as the request's page, so later hits count it again.
	if st := rep.Runs[0]; st.CorruptPages < served.Load() {
		t.Fatalf("the default bench with a match one page too long served %d wrong pages and reported %d corrupt (%d verified)", served.Load(), st.CorruptPages, st.VerifiedPages)
	}
}
