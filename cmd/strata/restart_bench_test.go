package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratakv/strata/node"
	"github.com/stratakv/strata/node/wire"
)

// BenchmarkServeStart measures what a `strata serve` start costs an engine:
// the time from starting the process to the first answered request (a Hello
// and its reply), for a new arena file (cold), one a killed service left
// holding objects (warm), and anonymous memory; for the warm start, the
// time until every object is recovered (served), and what came back; and,
// with STRATA_START_WARMUP=1, the background warm-up of the whole arena:
//
//	STRATA_START_ARENAS=1GiB,8GiB STRATA_START_FILL=768MiB \
//	    go test -run '^$' -bench ServeStart -benchtime 1x ./cmd/strata
//
// The arena file is on /dev/shm, sparse: only the objects and the memory
// the warm-up populated before the process ends take memory. The objects are
// 64 KiB pages (STRATA_START_OBJECT sets another size).
func BenchmarkServeStart(b *testing.B) {
	arenas := strings.Split(envOr("STRATA_START_ARENAS", "1GiB"), ",")
	fill, err := parseBytes(envOr("STRATA_START_FILL", "256MiB"))
	if err != nil {
		b.Fatal(err)
	}
	obj, err := parseBytes(envOr("STRATA_START_OBJECT", "64KiB"))
	if err != nil {
		b.Fatal(err)
	}
	for _, arena := range arenas {
		size, err := parseBytes(arena)
		if err != nil {
			b.Fatal(err)
		}
		b.Run("arena="+arena, func(b *testing.B) {
			dir := shmArenaDir(b, fill+64<<20)
			tmp, err := os.MkdirTemp("", "sb")
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { os.RemoveAll(tmp) })
			socket := filepath.Join(tmp, "s")
			file := filepath.Join(dir, "a")
			for b.Loop() {
				// Cold: a new arena file.
				os.Remove(file)
				first, s := timeFirstAnswer(b, socket, "--arena", arena, "--arena-file", file)
				b.ReportMetric(ms(first), "cold-first-answer-ms")
				// Fill it, and kill it.
				n := fillObjects(b, socket, fill, obj)
				_ = s.cmd.Process.Signal(syscall.SIGKILL)
				<-s.exited
				// Warm: the same file.
				first, s = timeFirstAnswer(b, socket, "--arena", arena, "--arena-file", file)
				b.ReportMetric(ms(first), "warm-first-answer-ms")
				st := waitRecovery(b, socket)
				r := st.Arena.Recovery
				b.ReportMetric(ms(r.Took), "recovered-ms")
				b.ReportMetric(ms(r.Took)/(float64(r.RecoveredBytes)/(1<<30)), "recovered-ms/GiB")
				b.ReportMetric(float64(r.Recovered), "objects-back")
				b.ReportMetric(float64(n), "objects-put")
				_ = s.cmd.Process.Signal(syscall.SIGKILL)
				<-s.exited
				os.Remove(file)
				// Anonymous memory.
				first, s = timeFirstAnswer(b, socket, "--arena", arena, "--arena-file", "")
				b.ReportMetric(ms(first), "anon-first-answer-ms")
				if os.Getenv("STRATA_START_WARMUP") == "1" {
					st := benchWaitReady(b, socket)
					b.ReportMetric(float64(st.Arena.SizeBytes)/st.Arena.WarmupTook.Seconds()/1e9, "anon-warmup-GB/s")
				}
				_ = s.cmd.Process.Signal(syscall.SIGKILL)
				<-s.exited
			}
			b.ReportMetric(float64(size>>30), "arena-GiB")
		})
	}
}

// waitRecovery waits until the service has recovered its arena file.
func waitRecovery(b *testing.B, socket string) node.Stats {
	b.Helper()
	for deadline := time.Now().Add(10 * time.Minute); ; time.Sleep(time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, _, err := fetchStats(ctx, socket)
		cancel()
		if err == nil && !st.Arena.Recovery.Recovering {
			return st
		}
		if time.Now().After(deadline) {
			b.Fatalf("not recovered: %v %+v", err, st.Arena.Recovery)
		}
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// timeFirstAnswer starts serve and returns the time until a Hello is
// answered.
func timeFirstAnswer(b *testing.B, socket string, args ...string) (time.Duration, *serveChild) {
	b.Helper()
	start := time.Now()
	s := spawnServe(b, socket, args...)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := wire.Dial(ctx, socket)
		if err == nil {
			err = conn.Send(ctx, wire.TypeHello, 1, wire.Hello{Version: wire.Version, ClientName: "first"})
			if err == nil {
				_, _, _, err = conn.Recv(ctx)
			}
			conn.Close()
		}
		cancel()
		if err == nil {
			return time.Since(start), s
		}
		select {
		case <-s.exited:
			b.Fatalf("strata serve exited: %v\n%s", s.err, s.log.String())
		default:
		}
		if time.Since(start) > 120*time.Second {
			b.Fatalf("no answer in 120 s: %v", err)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// fillObjects puts bytes worth of objects of obj bytes and returns how many
// were acknowledged.
func fillObjects(b *testing.B, socket string, bytes, obj int64) int {
	b.Helper()
	c := newRestartClient(b, socket, "fill")
	n := 0
	per := int(min(int64(clientSegment)/obj, 64))
	for i := 0; int64(i)*obj < bytes; i += per {
		var keys []string
		var sizes []int
		for j := range per {
			keys, sizes = append(keys, fmt.Sprintf("fill/%08d", i+j)), append(sizes, int(obj))
		}
		acked, err := c.put(keys, sizes)
		if err != nil {
			b.Fatal(err)
		}
		n += len(acked)
	}
	return n
}

func benchWaitReady(b *testing.B, socket string) node.Stats {
	b.Helper()
	for deadline := time.Now().Add(10 * time.Minute); ; time.Sleep(2 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, _, err := fetchStats(ctx, socket)
		cancel()
		if err == nil && st.Start.State == node.StateReady {
			return st
		}
		if time.Now().After(deadline) {
			b.Fatalf("not ready: %v %+v", err, st.Start)
		}
	}
}
