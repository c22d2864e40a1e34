package sim

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/stratakv/strata/hicache"
	"github.com/stratakv/strata/pool"
)

// overlongMatch is a deliberate bug for the tests that prove the bench's
// verification catches it: a decorator of the cache's Match, so that the cache
// itself has no branch for tests. It is the classic off-by-one at a split
// point: where a request's match ends and another prompt seen before went on
// from the same prefix with other tokens (the request diverges inside a cached
// span), the request is served one page more, a copy of that other
// continuation's first page, in a page it owns (AllocDevice, appended to its
// DevicePages as a load of the cache's would be, so Insert, Finish and Release
// account for it as for any page the cache loaded for the request). The cache's
// accounting stays sound; only the served bytes are wrong.
type overlongMatch struct {
	cache *hicache.Cache
	kv    *kvModel
	ps    int

	mu sync.Mutex
	// next maps the prefix digest at the end of a whole page of a prompt seen
	// before to the digests of that prompt's next page (and the one after it,
	// which a draft pool's entries depend on).
	next map[uint64][]uint64
	// served counts the pages the fault served, for the test that set it.
	served *atomic.Int64
}

func newOverlongMatch(cache *hicache.Cache, kv *kvModel, ps int, served *atomic.Int64) *overlongMatch {
	return &overlongMatch{cache: cache, kv: kv, ps: ps, next: map[uint64][]uint64{}, served: served}
}

// match is hicache.Cache.Match of a's prompt, with the fault.
func (o *overlongMatch) match(ctx context.Context, a *active, opts hicache.MatchOptions) (*hicache.Request, error) {
	r, err := o.cache.Match(ctx, a.req.Prompt, opts)
	if err != nil {
		return r, err
	}
	prompt, hit := len(a.req.Prompt), r.HitTokens
	o.mu.Lock()
	other, ok := o.next[a.hs[max(hit-1, 0)]]
	for end := o.ps; end+o.ps <= prompt; end += o.ps {
		o.next[a.hs[end-1]] = slices.Clone(a.hs[end:min(end+o.ps+1, prompt)])
	}
	o.mu.Unlock()
	if !ok || hit == 0 || hit%o.ps != 0 || hit+o.ps > prompt || other[o.ps-1] == a.hs[hit+o.ps-1] {
		return r, nil
	}
	page, err := o.cache.AllocDevice(1)
	if errors.Is(err, hicache.ErrDeviceFull) {
		return r, nil
	}
	if err != nil {
		return nil, errors.Join(err, o.cache.Release(r))
	}
	hs := append(make([]uint64, hit, hit+len(other)), other...)
	table := make([]pool.PageID, hit/o.ps+1)
	table[hit/o.ps] = page[0]
	for i := range o.kv.pools {
		o.kv.fill(&o.kv.pools[i], hs, table, hit, hit+o.ps)
	}
	r.DevicePages = append(r.DevicePages, page[0])
	r.L2Tokens += o.ps
	r.HitTokens += o.ps
	o.served.Add(1)
	return r, nil
}
