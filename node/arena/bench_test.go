package arena

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratakv/strata/hostmem"
)

// BenchmarkWriteRead stores and reads back 4 MiB objects in a 64 MiB arena, 64
// keys round robin, so that nearly every write evicts (background or synchronous,
// through an OnEvict that touches nothing). One op is Reserve, a 4 MiB copy in,
// Commit, Acquire and Release; x-of-memcpy is that against the copy alone into
// the same kind and amount of memory, measured in the same run: the arena's
// overhead.
func BenchmarkWriteRead(b *testing.B) {
	const obj = 4 << 20
	al, err := hostmem.New(hostmem.Config{Kind: hostmem.Mmap, Prefault: true, TransparentHugePages: true})
	if err != nil {
		b.Fatal(err)
	}
	cfg := DefaultConfig(64 << 20)
	cfg.Allocator, cfg.Logger = al, slog.New(slog.DiscardHandler)
	cfg.Warmup = false // prefaulted by the allocator
	var spilled atomic.Int64
	cfg.OnEvict = func(e Evicted) bool { spilled.Add(int64(len(e.Bytes))); return true }
	a, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	src := make([]byte, obj)
	for i := range src {
		src[i] = byte(i)
	}
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = fmt.Sprintf("model/%d/page-%d/k", i%4, i)
	}

	b.SetBytes(obj)
	b.ResetTimer()
	i := 0
	for b.Loop() {
		key := keys[i%len(keys)]
		i++
		a.Remove(key) // a key that survived a lap is rewritten, as after a promotion
		p, err := a.Reserve(key, 1, obj)
		if err != nil {
			b.Fatal(err)
		}
		copy(p.Bytes(), src)
		if err := p.Commit(); err != nil {
			b.Fatal(err)
		}
		l, err := a.Acquire(key, 1)
		if err != nil {
			b.Fatal(err)
		}
		l.Release()
	}
	b.StopTimer()
	per := b.Elapsed() / time.Duration(b.N)
	// The limit: the copy alone, round robin into 64 MiB of mapped memory of the
	// same kind, so that the destination is as cold as the arena's.
	dst, err := al.Allocate("memcpy", 64<<20)
	if err != nil {
		b.Fatal(err)
	}
	defer dst.Close()
	const copies = 512
	for c := range 16 { // warm up
		copy(dst.Bytes()[c*obj:(c+1)*obj], src)
	}
	start := time.Now()
	for c := range copies {
		off := c % 16 * obj
		copy(dst.Bytes()[off:off+obj], src)
	}
	memcpy := time.Since(start) / copies

	b.ReportMetric(float64(memcpy)/float64(per), "x-of-memcpy")
	st := a.Stats()
	b.ReportMetric(float64(st.Evictions)/float64(b.N), "evictions/op")
}
