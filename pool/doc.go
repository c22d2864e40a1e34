// Package pool holds the KV pools strata moves pages between: host pools (L2) that
// strata allocates, grouped so that a target model and its speculative-decoding
// draft model share one page space; the DevicePool interface through which strata
// sees the engine's accelerator pools (L1), with a host-memory stand-in; and the
// copy engine that moves pages between the two layouts on worker goroutines.
//
// Constructors. The project's components follow Config + DefaultConfig + New; this
// package holds four components (host pool groups, the page allocator, the host
// stand-in for device pools, the copy engine), so a bare Config or New would not say
// which one it builds. Each constructor carries its component's name instead:
// BuildGroup with GroupSpec, NewPageAllocator, NewMemDevicePool and
// NewMemDeviceGroup, and CopyConfig with DefaultCopyConfig and NewCopyEngine, the
// pattern's three parts under one prefix. Splitting the package to get the bare names
// would put the copy engine, which reads both layouts, in a package of its own that
// imports the other two for no gain in what a reader can see.
package pool
