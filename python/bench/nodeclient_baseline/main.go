// Command nodeclient_baseline is the Go side of python/bench/bench_plugin.py:
// storage/nodeclient's batch Put and Get of the same geometry, pages and ranges
// as the plugin's batch_set_v1 and batch_get_v1 (Llama-3-8B, 32-token pages,
// page_first: one 2 MiB K and one 2 MiB V range per page), one client, against
// the same service, so that the two are compared like for like in one run.
//
// It connects to --socket, registers a host pool of 2 x --pages pages, and then
// serves commands on stdin, one a line, so that the script can alternate Go and
// Python rounds on one warm client:
//
//	run N     put N batches of --pages fresh keys from the pool's first half and
//	          get each back into the second half; answers one JSON line
//	          {"put_s": [...], "get_s": [...], "bytes": bytes a batch moves}
//	exists N  times N Exists of --pages stored keys; answers {"exists_s": [...]}
//
// Not a test: python/bench/bench_plugin.py builds and runs it.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
	"github.com/stratakv/strata/storage/nodeclient"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "nodeclient_baseline:", err)
		os.Exit(1)
	}
}

func run() error {
	socket := flag.String("socket", "", "the node service's socket")
	pages := flag.Int("pages", 128, "pages per batch")
	tag := flag.String("tag", fmt.Sprint(os.Getpid()), "makes this run's keys distinct from other runs'")
	flag.Parse()
	if *socket == "" || *pages < 1 {
		return errors.New("give --socket and a positive --pages")
	}
	ctx := context.Background()
	cfg := nodeclient.DefaultConfig(*socket)
	cfg.ClientName = "bench-plugin-go-baseline"
	cfg.CallTimeout = 5 * time.Minute
	cfg.Logger = slog.New(slog.DiscardHandler)
	b, err := nodeclient.New(cfg)
	if err != nil {
		return err
	}
	defer b.Close()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = b.WaitConnected(wctx)
	cancel()
	if err != nil {
		return err
	}
	base := hostmem.DefaultConfig(hostmem.Mmap)
	base.ReserveBytes = 0 // the script checked the memory; SGLang's pool is already allocated
	alloc, err := storage.HostAllocator(b, base)
	if err != nil {
		return err
	}
	// SGLang's MHATokenToKVPoolHost in page_first over a device pool of --pages
	// pages, host ratio 2: the geometry bench_plugin.py gives the plugin.
	g, err := pool.BuildGroup(pool.GroupSpec{
		Pools:    []pool.PoolSpec{{Name: pagekey.TargetPool, Geometry: kvlayout.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, DTypeBytes: 2}}},
		Layout:   kvlayout.PageFirst,
		PageSize: 32,
		Pages:    2 * *pages,
	}, alloc)
	if err != nil {
		return err
	}
	defer g.Close()
	hp := g.Target()
	if err := b.RegisterPool(ctx, storage.SpecOf(hp, pagekey.Names{})); err != nil {
		return err
	}
	mem := hp.Bytes()
	for i := range mem {
		mem[i] = byte(i*7 + i>>12)
	}
	src, dst := make([]pool.PageID, *pages), make([]pool.PageID, *pages)
	for i := range src {
		src[i], dst[i] = pool.PageID(i), pool.PageID(*pages+i)
	}
	batchBytes := int64(len(mem)) / 2
	var stored []pagekey.Key
	next := 0
	freshKeys := func() []pagekey.Key {
		ks := make([]pagekey.Key, *pages)
		for i := range ks {
			d := sha256.Sum256([]byte(fmt.Sprintf("go-baseline-%s-%d", *tag, next)))
			next++
			ks[i], _ = pagekey.KeyFromDigest(d[:])
		}
		return ks
	}
	out := json.NewEncoder(os.Stdout)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			return fmt.Errorf("command %q: want \"run N\" or \"exists N\"", sc.Text())
		}
		n, err := strconv.Atoi(f[1])
		if err != nil || n < 1 {
			return fmt.Errorf("command %q: want a positive count", sc.Text())
		}
		switch f[0] {
		case "run":
			var puts, gets []float64
			for range n {
				ks := freshKeys()
				t0 := time.Now()
				perrs := b.Put(ctx, pagekey.TargetPool, ks, src)
				t1 := time.Now()
				gerrs := b.Get(ctx, pagekey.TargetPool, ks, dst)
				t2 := time.Now()
				if err := errors.Join(append(perrs, gerrs...)...); err != nil {
					return err
				}
				// Untimed: the pages read back are the pages put.
				for i := range src {
					for buf := range 2 {
						a, _ := hp.PageBuffer(buf, src[i])
						d, _ := hp.PageBuffer(buf, dst[i])
						if !bytes.Equal(a, d) {
							return fmt.Errorf("page %d buffer %d read back differs from the page put", i, buf)
						}
						clear(d)
					}
				}
				puts = append(puts, t1.Sub(t0).Seconds())
				gets = append(gets, t2.Sub(t1).Seconds())
				stored = ks
			}
			if err := out.Encode(map[string]any{"put_s": puts, "get_s": gets, "bytes": batchBytes}); err != nil {
				return err
			}
		case "exists":
			if stored == nil {
				return errors.New("exists before run: nothing stored")
			}
			times := make([]float64, 0, n)
			for range n {
				t0 := time.Now()
				got, err := b.Exists(ctx, pagekey.TargetPool, stored)
				times = append(times, time.Since(t0).Seconds())
				if err != nil || got != len(stored) {
					return fmt.Errorf("exists: %d of %d, %v", got, len(stored), err)
				}
			}
			if err := out.Encode(map[string]any{"exists_s": times}); err != nil {
				return err
			}
		default:
			return fmt.Errorf("command %q: want \"run N\" or \"exists N\"", sc.Text())
		}
	}
	return sc.Err()
}
