package storagebench

import (
	"context"
	"testing"
	"time"

	"github.com/stratakv/strata/pagekey"
)

// BenchmarkNodeLargePages is `strata bench tiers --backend node --no-redis` at a
// quarter of its size (2 batches of 64 Llama-3-8B pages of 2 MiB objects, one
// engine then two) as a Go benchmark, so that the service's large-object path
// can be profiled:
//
//	go test -run '^$' -bench NodeLargePages -benchtime 1x -cpuprofile cpu.out ./storagebench
//	go tool pprof -top storagebench.test cpu.out
//
// One op is the whole run; the metrics are its put and get ratios over the
// memcpy peer (the median of the alternated batches), one engine and two.
func BenchmarkNodeLargePages(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Backend, cfg.Dir, cfg.NoRedis = BackendNode, b.TempDir(), true
	cfg.Batches, cfg.PagesPerBatch, cfg.ExistsCalls = 2, 64, 20
	var put, get, put2, get2 float64
	for b.Loop() {
		rep, err := Run(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		if rep.MismatchedPages != 0 {
			b.Fatalf("%d pages read back with other bytes", rep.MismatchedPages)
		}
		put, get = put+rep.PutRatio, get+rep.GetRatio
		put2, get2 = put2+rep.Engines.PutRatio, get2+rep.Engines.GetRatio
	}
	n := float64(b.N)
	b.ReportMetric(put/n, "put-x-memcpy")
	b.ReportMetric(get/n, "get-x-memcpy")
	b.ReportMetric(put2/n, "put2-x-memcpy")
	b.ReportMetric(get2/n, "get2-x-memcpy")
}

// BenchmarkNodeLargeCPU puts and gets batches of 32 Llama-3-8B pages (2 MiB
// objects, 128 MiB a batch) through an embedded node service and through the
// memcpy peer, alternated batch by batch, and states the CPU the process (the
// engine and the service, both in it) spends per byte beside the peer's: on a
// machine shared with other work the CPU time is steadier than the wall time,
// and it says how much work the service adds to the copies however the
// scheduler treats them.
//
//	go test -run '^$' -bench NodeLargeCPU -benchtime 8x ./storagebench
//
// put-cpu-x and get-cpu-x are the node's CPU over the peer's for the same bytes
// (1 is no work beyond the copy), put-x-memcpy and get-x-memcpy the wall-time
// ratios (the peer's time over the node's).
func BenchmarkNodeLargeCPU(b *testing.B) {
	ctx := context.Background()
	cfg := DefaultConfig()
	cfg.Backend, cfg.Dir, cfg.NoRedis = BackendNode, b.TempDir(), true
	cfg.PagesPerBatch, cfg.Batches = 32, b.N
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	shape := cfg.shape()
	r := &run{cfg: cfg, shape: shape, scratch: cfg.Dir, seen: map[pagekey.Key]struct{}{}, namespace: "bench-large", rep: &Report{}}
	r.rep.Bytes = int64(cfg.Batches) * int64(cfg.PagesPerBatch) * shape.PageBytes()
	defer func() {
		if err := r.close(); err != nil {
			b.Error(err)
		}
	}()
	var err error
	r.target, err = NodeTarget(Scratch{Dir: cfg.Dir, Bytes: r.rep.Bytes, BatchBytes: r.batchBytes(), ObjectBytes: shape.PartBytes(), NoRedis: true})
	if err != nil {
		b.Skip(err) // the machine's memory: fewer iterations fit
	}
	r.targetBuilt = true
	backend, err := r.open(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if r.e, err = r.newEngine(ctx, backend, nil, 0, ""); err != nil {
		b.Fatal(err)
	}
	e, peer := r.e, r.target.Peer
	if _, _, err := e.warmUp(ctx); err != nil {
		b.Fatal(err)
	}
	// The peer maps and prefaults its region at its first Write: outside the
	// figures, as in a run.
	if _, err := peer.Write(ctx, nil); err != nil {
		b.Fatal(err)
	}
	dstPages := e.dstPages()
	dst := e.chunks(dstPages)
	var nodeCPU, peerCPU, nodeWall, peerWall [2]time.Duration // put, get
	timed := func(cpu, wall *time.Duration, f func() error) error {
		c0, t0 := processCPU(), time.Now()
		err := f()
		*wall += time.Since(t0)
		*cpu += processCPU() - c0
		return err
	}
	var bad int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		e.fill(i)
		b.StartTimer()
		src := e.chunks(e.srcPages(i))
		nodePut := func() error {
			return timed(&nodeCPU[0], &nodeWall[0], func() error {
				return batchError("put", i, e.backend.Put(ctx, pagekey.TargetPool, e.keys[i], e.srcPages(i)))
			})
		}
		peerPut := func() error {
			return timed(&peerCPU[0], &peerWall[0], func() error { _, err := peer.Write(ctx, src); return err })
		}
		nodeGet := func() error {
			clearAll(dst)
			err := timed(&nodeCPU[1], &nodeWall[1], func() error {
				return batchError("get", i, e.backend.Get(ctx, pagekey.TargetPool, e.keys[i], dstPages))
			})
			bad += e.verify(i, dst)
			return err
		}
		peerGet := func() error {
			clearAll(dst)
			err := timed(&peerCPU[1], &peerWall[1], func() error { _, err := peer.Read(ctx, dst); return err })
			bad += e.verify(i, dst)
			return err
		}
		if err := alternate(i, nodePut, peerPut); err != nil {
			b.Fatal(err)
		}
		if err := alternate(i, nodeGet, peerGet); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if bad != 0 {
		b.Fatalf("%d pages read back with other bytes", bad)
	}
	b.ReportMetric(float64(nodeCPU[0])/float64(peerCPU[0]), "put-cpu-x")
	b.ReportMetric(float64(nodeCPU[1])/float64(peerCPU[1]), "get-cpu-x")
	b.ReportMetric(float64(peerWall[0])/float64(nodeWall[0]), "put-x-memcpy")
	b.ReportMetric(float64(peerWall[1])/float64(nodeWall[1]), "get-x-memcpy")
}
