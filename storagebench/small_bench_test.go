package storagebench

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stratakv/strata/internal/redisproc"
	"github.com/stratakv/strata/pagekey"
)

// BenchmarkNodeSmallObjects measures 1 KiB objects through the node service
// (storage/nodeclient against a service started in the process) beside a
// redis-server on loopback driven by the raw go-redis pipeline peer, the same
// objects under the same names: one batch of 128 pages (256 objects) put once,
// then each iteration gets the batch through both, their order alternated, so
// that x-of-redis (Redis's time over the node service's, over every iteration)
// compares two runs that met the same machine. Profile the service's per-object path with
// `go test -bench NodeSmallObjects -cpuprofile cpu.out ./storagebench/`.
func BenchmarkNodeSmallObjects(b *testing.B) {
	if err := redisproc.Installed(); err != nil {
		b.Skip(err)
	}
	for _, size := range []int64{1024, 16 << 10} {
		b.Run(fmt.Sprintf("get-%dB", size), func(b *testing.B) { benchSmallGet(b, size) })
	}
}

// benchSmallGet sets up one engine of the node service and a Redis peer and
// times gets of one batch of objects of size bytes through each.
func benchSmallGet(b *testing.B, size int64) {
	ctx := context.Background()
	cfg := DefaultConfig()
	cfg.Backend, cfg.ObjectBytes, cfg.Dir = BackendNode, size, b.TempDir()
	cfg.Batches = 1
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	shape := cfg.shape()
	r := &run{cfg: cfg, shape: shape, scratch: cfg.Dir, seen: map[pagekey.Key]struct{}{}, namespace: "bench-small",
		rep: &Report{}}
	r.rep.Bytes = int64(cfg.Batches) * int64(cfg.PagesPerBatch) * shape.PageBytes()
	defer func() {
		if err := r.close(); err != nil {
			b.Error(err)
		}
	}()
	var err error
	r.target, err = NodeTarget(Scratch{Dir: cfg.Dir, Bytes: r.rep.Bytes, BatchBytes: r.batchBytes(), ObjectBytes: shape.PartBytes()})
	if err != nil {
		b.Fatal(err)
	}
	r.targetBuilt = true
	if r.target.Redis == nil {
		b.Skip("no redis-server")
	}
	backend, err := r.open(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if r.e, err = r.newEngine(ctx, backend, nil, 0, ""); err != nil {
		b.Fatal(err)
	}
	e, redis := r.e, r.target.Redis.(NamedPeer)
	if _, _, err := e.warmUp(ctx); err != nil {
		b.Fatal(err)
	}
	e.fill(0)
	objects := len(e.names(0))
	var node, peer, nodeCPU time.Duration
	if errs := e.backend.Put(ctx, pagekey.TargetPool, e.keys[0], e.srcPages(0)); batchError("put", 0, errs) != nil {
		b.Fatal(batchError("put", 0, errs))
	}
	if _, err := redis.WriteNamed(ctx, e.names(0), e.chunks(e.srcPages(0))); err != nil {
		b.Fatal(err)
	}
	dstPages := e.dstPages()
	names := e.names(0)
	dst := e.chunks(dstPages)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		nodeGet := func() error {
			cpu0 := processCPU()
			start := time.Now()
			errs := e.backend.Get(ctx, pagekey.TargetPool, e.keys[0], dstPages)
			node += time.Since(start)
			nodeCPU += processCPU() - cpu0
			return batchError("get", 0, errs)
		}
		redisGet := func() error {
			d, err := redis.ReadNamed(ctx, names, dst)
			peer += d
			return err
		}
		if err := alternate(i, nodeGet, redisGet); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if bad := e.verify(0, dst); bad != 0 {
		b.Fatalf("%d pages read back wrong", bad)
	}
	b.ReportMetric(float64(node)/float64(b.N*objects), "node-ns/object")
	b.ReportMetric(float64(peer)/float64(b.N*objects), "redis-ns/object")
	b.ReportMetric(float64(peer)/float64(node), "x-of-redis")
	// The CPU the process (client and service) spent on the node's gets: steadier
	// than their wall time on a busy machine, and what the service's per-object
	// work costs.
	b.ReportMetric(float64(nodeCPU)/float64(b.N*objects), "node-cpu-ns/object")
}

// alternate runs a then c on even iterations and c then a on odd ones.
func alternate(i int, a, c func() error) error {
	if i%2 == 1 {
		a, c = c, a
	}
	if err := a(); err != nil {
		return err
	}
	return c()
}

// processCPU is the user and system CPU time the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
