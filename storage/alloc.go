package storage

import (
	"github.com/stratakv/strata/hostmem"
)

// HostAllocator returns the allocator to build a host pool group with so that every
// pool of it can register with b: base with its kind replaced by b's Allocator
// when b needs one. This is the one place an engine picks host memory for a group
// with L3: give the result to pool.BuildGroup, and the draft pools get the same
// memory as the target pool.
func HostAllocator(b Backend, base hostmem.Config) (*hostmem.Allocator, error) {
	if b != nil {
		if kind := b.Allocator(); kind != "" {
			base.Kind = kind
		}
	}
	return hostmem.New(base)
}
