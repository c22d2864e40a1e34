// Package memstat reads what a process's memory costs, for the benchmarks that
// state bytes per object and the garbage collector's cost with many objects
// held (node/arena's ObjectMemory, node/spill's IndexMemory): the resident set,
// which counts memory mapped outside the Go heap as well, the Go heap after a
// full collection, and the collector's CPU time.
package memstat

import (
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
)

// RSSBytes is the process's resident memory, from /proc/self/statm.
func RSSBytes() (int64, error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, fmt.Errorf("resident memory: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, fmt.Errorf("resident memory: /proc/self/statm holds %q, want at least two fields", b)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("resident memory: /proc/self/statm: %w", err)
	}
	return pages * int64(os.Getpagesize()), nil
}

// GCCPUSeconds is the CPU time the garbage collector has spent so far.
func GCCPUSeconds() float64 {
	s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	metrics.Read(s)
	return s[0].Value.Float64()
}

// HeapInuse is the Go heap in use after a full collection, so that garbage
// does not count.
func HeapInuse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}
