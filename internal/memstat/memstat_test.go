package memstat

import (
	"syscall"
	"testing"
)

// Touching 64 MiB of anonymous memory outside the Go heap grows the resident
// set by about that much and the Go heap by almost nothing.
func TestRSSCountsMemoryOutsideTheHeap(t *testing.T) {
	const size = 64 << 20
	heap0 := HeapInuse()
	rss0, err := RSSBytes()
	if err != nil {
		t.Fatal(err)
	}
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Munmap(mem) }()
	for i := 0; i < size; i += 4096 {
		mem[i] = 1
	}
	rss1, err := RSSBytes()
	if err != nil {
		t.Fatal(err)
	}
	if grew := rss1 - rss0; grew < size*9/10 {
		t.Errorf("resident memory grew by %d bytes after touching %d", grew, size)
	}
	if grew := HeapInuse() - heap0; grew > 4<<20 {
		t.Errorf("the Go heap grew by %d bytes for memory mapped outside it", grew)
	}
	if GCCPUSeconds() < 0 {
		t.Errorf("negative GC CPU time")
	}
}
