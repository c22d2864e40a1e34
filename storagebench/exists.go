package storagebench

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/stratakv/strata/pagekey"
)

func (r *run) existsPhase(ctx context.Context) error {
	n := r.cfg.ExistsCalls
	if n == 0 {
		return nil
	}
	e := r.e
	r.progress("%d exists calls", n)
	times := make([]time.Duration, 0, n)
	short := 0
	for c := range n {
		b := c % r.cfg.Batches
		if r.target.PerBatch {
			b = r.cfg.Batches - 1 // the others were forgotten
		}
		keys := e.keys[b]
		start := time.Now()
		got, err := e.backend.Exists(ctx, pagekey.TargetPool, keys)
		times = append(times, time.Since(start))
		if err != nil {
			return fmt.Errorf("exists call %d: %w", c, err)
		}
		if got != len(keys) {
			short++
		}
	}
	if short > 0 {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("%d of %d exists calls found fewer keys than were put", short, n))
	}
	slices.Sort(times)
	r.rep.ExistsCalls, r.rep.ExistsKeys = n, r.cfg.PagesPerBatch
	r.rep.ExistsP50us = percentile(times, 0.50).Seconds() * 1e6
	r.rep.ExistsP99us = percentile(times, 0.99).Seconds() * 1e6
	return nil
}

// percentile is the nearest-rank percentile of sorted durations.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
