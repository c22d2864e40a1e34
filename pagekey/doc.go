// Package pagekey computes page keys: content addresses of token pages, chained so
// that one key names a whole prefix.
//
// The default algorithm is byte-compatible with SGLang HiCache: for each page,
// sha256(previous digest as 32 raw bytes || each token as 4 bytes little-endian),
// rendered as lowercase hex. A namespace (extra key and/or cache salt) seeds the
// chain so two tenants never share keys. EAGLE bigram mode hashes each page's
// token pairs (t[i], t[i+1]) member by member. XXH3-128 is an opt-in, much faster
// chain for deployments that do not share keys with SGLang.
package pagekey
