// Package hicache is the hierarchical KV cache an engine calls on every request: a
// paged radix tree over a pool group (target model plus EAGLE draft pools), L1 in
// the engine's device pools and L2 in host pools. It finds the longest cached
// prefix of a request (loading the part found only in L2 back into L1), caches
// the pages a request computed, backs L1 pages up to L2 under a write policy, and
// evicts from both tiers under pressure. Target and draft pages move together: a
// page is cached for the group in a tier only when every pool has it there.
//
// Concurrency: a Cache is safe for concurrent use; its methods serialise on one
// mutex. Copies run on the copy engine's goroutines and never touch the tree: a
// finished copy is accounted for by the next call into the cache (or by Sync), so
// the tree only changes inside calls. No call waits for a copy while it holds the
// cache: when L1 is short of pages that copies in flight hold (backups, write-back
// evictions), Match and AllocDevice wait for those copies with the cache released
// and try again. A Request's Wait and WaitLayer block on copies without holding
// the cache.
//
// Lifecycle of a request: Match (locks the prefix, starts loading its L2 part),
// AllocDevice for the pages to compute, Insert after prefill (the new pages
// become cached, the lock moves to them), Finish when the request ends (caches
// the decoded pages too, frees the partial last page, unlocks).
//
// Errors and panics follow the project's rule: anything from outside the cache
// is an error, a broken invariant of its own is a panic. What an engine can get
// wrong (a page table that does not start with the request's prefix, a Request
// used after Finish, freeing pages it was not given) is an error wrapping
// ErrRequest, a full L1 is ErrDeviceFull, and storage and copy failures are
// errors or misses the engine recomputes. The cache's own accounting out of step
// (the tree refusing a lock, reference or tier change for a node the cache says
// allows it; a page space refusing pages the cache holds) is a bug no caller can
// cause or repair: must, freeDev and freeHost panic, naming what disagrees,
// rather than going on to free or serve pages a copy or a request still uses.
//
// Files: cache.go is the API and request.go a Request; core.go holds the cache
// logic's state and copies in flight, match.go serves a match (with the L2 load
// back), insert.go caches a request's pages, evict.go makes room in L1, backup.go
// copies L1 into L2 and makes room there, reap.go accounts for finished copies
// and settles failed ones; l3.go, core_l3.go and prefetch.go are the L3 tier.
package hicache
