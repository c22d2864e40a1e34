// Package pageid names the pages of a KV page space: the one type that the
// radix tree (which records where a node's pages live) and the pools (which
// hold the pages' bytes) share. It is a leaf, so that the tree depends on no
// pool and a pool on no tree.
package pageid

// ID names one page of a pool, or of every pool of a group, which share one
// page space: token slots ID*PageSize through ID*PageSize+PageSize-1. It is
// an index, not a pointer, so that page tables are plain slices an engine can
// hand to its kernels.
type ID int32
