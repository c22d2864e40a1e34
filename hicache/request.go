package hicache

import (
	"context"
	"errors"

	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
)

// Request is one engine request's hold on the cache, from Match to Finish or
// Release. While it is held, its cached prefix stays in L1.
type Request struct {
	cache *Cache
	// Tokens is the number of tokens the request was matched with.
	Tokens int
	// HitTokens is the length of the cached prefix the engine can use instead of
	// computing it: L1Tokens + L2Tokens + L3Tokens.
	HitTokens int
	// L1Tokens were in L1 when the request was matched.
	L1Tokens int
	// L2Tokens are being loaded from L2 into L1; Wait or WaitLayer before use.
	L2Tokens int
	// L3Tokens were fetched from L3 by the request's prefetch and are being loaded
	// into L1 after the L2 part. When their draft KV is missing (a draft pool runs
	// without L3) they are the request's alone until Finish caches them, and
	// DraftRecompute* names them.
	L3Tokens int
	// DraftRecomputeFrom and DraftRecomputeTokens name the hit tokens whose draft
	// KV the engine must recompute before using the prefix: [From, From+Tokens).
	// The target KV of those tokens is valid.
	DraftRecomputeFrom   int
	DraftRecomputeTokens int
	// DevicePages holds the prefix: page i holds tokens [i*PageSize, (i+1)*PageSize).
	// The engine reads them; pass them at the head of the page table to Insert and
	// Finish.
	DevicePages []pool.PageID

	ns    pagekey.Key
	owned int // leading DevicePages the tree owns; the rest the cache loaded for this request
	loads []*pool.Transfer
	node  any // the locked radix node
	done  bool
}

// Loading reports whether some of the prefix is still being copied into L1.
func (r *Request) Loading() bool {
	for _, t := range r.loads {
		select {
		case <-t.Done():
		default:
			return true
		}
	}
	return false
}

// Wait waits until every page of the prefix is in L1. An error means some of the
// prefix could not be loaded; the engine must recompute the prefix.
func (r *Request) Wait(ctx context.Context) error {
	var errs []error
	for _, t := range r.loads {
		if err := t.Wait(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// WaitLayer waits until layer of the group's pool-th pool is in L1 for every page
// of the prefix, so the engine can run that layer while later ones still copy.
func (r *Request) WaitLayer(ctx context.Context, pool, layer int) error {
	var errs []error
	for _, t := range r.loads {
		if err := t.WaitLayer(ctx, pool, layer); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
