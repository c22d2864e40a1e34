package hicache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// Cache is the hierarchical cache. See the package comment.
type Cache struct {
	mu     sync.Mutex
	closed bool
	impl   engine
	cfg    Config
	log    *slog.Logger
}

// Options are the cache's collaborators.
type Options struct {
	// Storage is the L3 backend; nil for a cache without L3. Build the host group
	// with the backend's allocator (storage.HostAllocator) so every pool can
	// register; a pool that cannot runs without L3.
	Storage storage.Backend
	// Logger receives warnings (a pool without L3, a slow backend); nil means
	// slog.Default().
	Logger *slog.Logger
}

// MatchOptions qualify a Match.
type MatchOptions struct {
	// Namespace separates tenants, LoRA adapters and cache salts: a request never
	// matches pages cached under another namespace, in any tier.
	Namespace pagekey.Namespace
	// Prefetch is the request's L3 prefetch (from Cache.Prefetch); Match waits for it
	// as the prefetch policy says, then serves what it brought.
	Prefetch *Prefetch
}

// engine is the cache's logic for one key type (tokens or bigrams); methods run
// under Cache.mu, except close. Methods that may need L1 pages that copies in
// flight hold return those copies (wait) instead of waiting: the caller waits
// without the cache and calls again.
type engine interface {
	match(tokens []uint32, opts MatchOptions) (r *Request, wait []*pool.Transfer, err error)
	complete(r *Request, opts MatchOptions, mayWait bool) (wait []*pool.Transfer, err error)
	prefetch(tokens []uint32, ns pagekey.Namespace, cache *Cache) *Prefetch
	insert(r *Request, tokens []uint32, pages []pool.PageID) ([]pool.PageID, error)
	unlock(r *Request) error
	releaseOwned(r *Request) error
	l3Idle() bool
	allocDeviceOrWait(n int, mayWait bool) (pages []pool.PageID, wait []*pool.Transfer, err error)
	freeDevice(pages []pool.PageID) error
	countWait()
	reap()
	inflight() []*pool.Transfer
	stats() Stats
	close(deadline time.Time) error
}

// maxCopyWaits bounds how many times one call waits for copies to free L1 pages
// before it takes what is free (a busy engine may keep starting backups that
// take the pages freed meanwhile).
const maxCopyWaits = 16

// waitCopies waits until every transfer of wait is done (successful or not).
func waitCopies(ctx context.Context, wait []*pool.Transfer) error {
	for _, t := range wait {
		select {
		case <-t.Done():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// New builds a cache over device (L1), host (L2) and opts.Storage (L3). host may be
// nil for an L1-only prefix cache; L3 needs L2. Each host pool registers with the
// backend on its own: a refusal disables L3 for that pool only, with a warning,
// and shows in Stats. The cache does not own the pools or the backend: close them
// after Close.
func New(cfg Config, device pool.DeviceGroup, host *pool.Group, opts Options) (*Cache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Storage != nil {
		if host == nil {
			return nil, fmt.Errorf("L3 without L2: prefetched pages land in the host pool, give the cache one: %w", ErrConfig)
		}
		if err := cfg.L3.Validate(); err != nil {
			return nil, err
		}
	}
	if len(device.Pools) == 0 || device.Pages == nil {
		return nil, fmt.Errorf("device group with no pools: %w", ErrConfig)
	}
	for _, p := range device.Pools {
		if p.Layout().PageSize != cfg.PageSize {
			return nil, fmt.Errorf("device pool %q has %d-token pages, the cache %d: %w", p.Name(), p.Layout().PageSize, cfg.PageSize, ErrConfig)
		}
	}
	if host != nil {
		if err := device.Validate(host); err != nil {
			return nil, fmt.Errorf("host group does not match the device group: %w", err)
		}
		if host.Pages() < device.Pages.Pages() {
			return nil, fmt.Errorf("L2 of %d pages is smaller than L1 of %d: every L1 page must fit L2 to be backed up; give the host pool at least the device pool's pages (SGLang uses 2-4x): %w",
				host.Pages(), device.Pages.Pages(), ErrConfig)
		}
	}
	maxPages := device.Pages.Pages()
	if host != nil {
		maxPages += host.Pages()
	}
	c := &Cache{cfg: cfg, log: opts.Logger}
	if c.log == nil {
		c.log = slog.Default()
	}
	var err error
	if cfg.Bigram {
		c.impl, err = newCore(cfg, device, host, maxPages, bigramKey, opts, &c.mu)
	} else {
		c.impl, err = newCore(cfg, device, host, maxPages, tokenKey, opts, &c.mu)
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Config returns the cache's configuration.
func (c *Cache) Config() Config { return c.cfg }

func (c *Cache) lock() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.impl.reap()
	return nil
}

// Prefetch starts looking tokens up in L3 (for the pages L1 and L2 lack), to run
// while the request waits to be scheduled; pass the result to Match. It never
// blocks on storage. It returns nil when there is nothing to fetch: no L3, all
// cached, fewer uncached tokens than the prefetch threshold, or L3 down. A
// prefetch for the same pages as one in flight joins it.
func (c *Cache) Prefetch(tokens []uint32, ns pagekey.Namespace) *Prefetch {
	if err := c.lock(); err != nil {
		return nil
	}
	defer c.mu.Unlock()
	return c.impl.prefetch(tokens, ns, c)
}

// Match finds the longest cached prefix of tokens, locks it in L1 for the
// request, and starts loading the part found only in L2 (when it is at least
// LoadBackMinTokens long and L1 has room). With opts.Prefetch, it first waits for
// the prefetch as the policy allows (without holding the cache), so the pages it
// brought are hits too. When L1 has room for the L2 part only once L1→L2 copies
// in flight are done, it waits for them, also without holding the cache; ctx
// bounds that wait. Fewer tokens than a page match nothing.
func (c *Cache) Match(ctx context.Context, tokens []uint32, opts MatchOptions) (*Request, error) {
	if p := opts.Prefetch; p != nil {
		if p.cache != c {
			return nil, fmt.Errorf("prefetch of another cache: %w", ErrRequest)
		}
		if p.settled {
			return nil, fmt.Errorf("prefetch already used: %w", ErrRequest)
		}
		p.settle(ctx, c.cfg.L3.PrefetchPolicy)
	}
	if err := c.lock(); err != nil {
		return nil, err
	}
	if p := opts.Prefetch; p != nil && p.settled {
		opts.Prefetch = nil // given up while waiting
	}
	r, wait, err := c.impl.match(tokens, opts)
	for round := 1; err == nil && len(wait) > 0; round++ {
		// L1 lacks room that copies in flight hold: wait for them without the
		// cache (other requests go on meanwhile; the prefix stays locked).
		c.impl.countWait()
		c.mu.Unlock()
		werr := waitCopies(ctx, wait)
		if err := c.lock(); err != nil {
			return nil, err // closed meanwhile: the tree and the request's hold are gone
		}
		if werr != nil {
			err = werr
			break
		}
		wait, err = c.impl.complete(r, opts, round < maxCopyWaits)
	}
	defer c.mu.Unlock()
	if err != nil {
		if r != nil {
			// A bug, or the context ended while waiting: give back what the
			// request holds (loads in flight keep their own holds).
			err = errors.Join(err, c.impl.releaseOwned(r), c.impl.unlock(r))
			if p := opts.Prefetch; p != nil {
				p.giveUp(outcomeCanceled)
			}
		}
		return nil, err
	}
	r.cache = c
	return r, nil
}

// AllocDevice takes n L1 pages for the engine to compute into, evicting unlocked
// pages (to L2 or out) when too few are free. When the pages L1 lacks are held by
// L1→L2 copies in flight, it waits for them (without holding the cache) and tries
// again. ErrDeviceFull means the running requests hold the whole pool.
func (c *Cache) AllocDevice(n int) ([]pool.PageID, error) {
	for round := 1; ; round++ {
		if err := c.lock(); err != nil {
			return nil, err
		}
		pages, wait, err := c.impl.allocDeviceOrWait(n, round < maxCopyWaits)
		if len(wait) == 0 {
			c.mu.Unlock()
			return pages, err
		}
		c.impl.countWait()
		c.mu.Unlock()
		if err := waitCopies(context.Background(), wait); err != nil {
			return nil, err
		}
	}
}

// FreeDevice returns L1 pages the engine allocated and will not insert.
func (c *Cache) FreeDevice(pages []pool.PageID) error {
	if err := c.lock(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	return c.impl.freeDevice(pages)
}

// Insert caches the whole pages of tokens after the engine computed them. pages is
// the request's page table: one L1 page per page of tokens (the partial last page
// included), starting with r.DevicePages. The cache takes the pages of the whole
// pages it did not have; where it already had a page in another L1 page, it frees
// the engine's copy. The returned page table (whole pages only) is what the
// engine uses from now on; the request's lock moves to its new end. Pages of
// it that the cache had may still be being loaded into L1 for another request:
// Insert adds those loads to r, so the engine calls Wait or WaitLayer (r.Loading
// tells) before it reads them.
func (c *Cache) Insert(r *Request, tokens []uint32, pages []pool.PageID) ([]pool.PageID, error) {
	if err := c.lock(); err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	if err := c.check(r); err != nil {
		return nil, err
	}
	return c.impl.insert(r, tokens, pages)
}

// Finish caches the request's whole pages as Insert does, frees its partial last
// page and ends the request.
func (c *Cache) Finish(r *Request, tokens []uint32, pages []pool.PageID) error {
	if err := c.lock(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if err := c.check(r); err != nil {
		return err
	}
	prefix, err := c.impl.insert(r, tokens, pages)
	if err != nil {
		return err
	}
	if err := c.impl.freeDevice(pages[len(prefix):]); err != nil {
		return err
	}
	r.done = true
	return c.impl.unlock(r)
}

// Release ends a request without caching anything more; the engine frees the pages
// it allocated beyond r.DevicePages with FreeDevice.
func (c *Cache) Release(r *Request) error {
	if err := c.lock(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if err := c.check(r); err != nil {
		return err
	}
	r.done = true
	return errors.Join(c.impl.releaseOwned(r), c.impl.unlock(r))
}

func (c *Cache) check(r *Request) error {
	if r == nil || r.cache != c {
		return fmt.Errorf("request of another cache: %w", ErrRequest)
	}
	if r.done {
		return fmt.Errorf("request already finished: %w", ErrRequest)
	}
	return nil
}

// Sync waits for every copy in flight (loads, backups, L3 prefetches and backups,
// including the backups to L3 that finished copies start) and accounts for them.
func (c *Cache) Sync(ctx context.Context) error {
	for {
		if err := c.lock(); err != nil {
			return err
		}
		pending := c.impl.inflight()
		idle := c.impl.l3Idle()
		c.mu.Unlock()
		if len(pending) == 0 && idle {
			// Account for what finished since the last look.
			if err := c.lock(); err != nil {
				return err
			}
			done := len(c.impl.inflight()) == 0 && c.impl.l3Idle()
			c.mu.Unlock()
			if done {
				return nil
			}
			continue
		}
		for _, t := range pending {
			if err := t.Wait(ctx); err != nil && ctx.Err() != nil {
				return err
			}
		}
		if !idle {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Millisecond):
			}
		}
	}
}

// Stats returns a snapshot of the cache's counters.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.impl.reap()
	}
	return c.impl.stats()
}

// Close waits for copies and L3 calls in flight, stops the L3 workers and the copy
// engine and releases the tree. It returns within Config.CloseTimeout even when
// the backend ignores canceled contexts: what has not finished by then is
// abandoned (logged), and the workers left in the backend never touch the tree
// again. The pools and the backend stay open; requests still held are abandoned.
func (c *Cache) Close() error {
	guard := c.cfg.closeTimeout()
	deadline := time.Now().Add(guard)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	err := c.Sync(ctx)
	if errors.Is(err, ErrClosed) {
		return nil
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	if err != nil {
		c.log.Warn("closing the cache with copies or L3 calls still running; they are abandoned",
			"waited", guard, "err", err)
	}
	// Without the lock: L3 workers take it to reserve host pages, and close waits
	// for them.
	return c.impl.close(deadline)
}

// tokenKey uses the tokens themselves as the tree key.
func tokenKey(tokens []uint32) []uint32 { return tokens }

// bigramKey packs EAGLE bigrams (t[i], t[i+1]) into one element each.
func bigramKey(tokens []uint32) []uint64 {
	if len(tokens) < 2 {
		return nil
	}
	out := make([]uint64, len(tokens)-1)
	for i := range out {
		out[i] = uint64(tokens[i])<<32 | uint64(tokens[i+1])
	}
	return out
}
