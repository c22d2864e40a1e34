package hostmem

import (
	"bytes"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

func newTestAllocator(t *testing.T, cfg Config) *Allocator {
	t.Helper()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestAllocateEveryKind(t *testing.T) {
	for _, kind := range []Kind{Mmap, Shm, HugeTLB} {
		for _, prefault := range []bool{true, false} {
			cfg := DefaultConfig(kind)
			cfg.Prefault = prefault
			cfg.ReserveBytes = 0
			cfg.Logger = slog.New(slog.DiscardHandler)
			a := newTestAllocator(t, cfg)
			r, err := a.Allocate("test-"+string(kind), 6<<20+123)
			if err != nil {
				t.Fatalf("%s: %v", kind, err)
			}
			if r.Size() < 6<<20+123 || r.Size()%4096 != 0 {
				t.Fatalf("%s: size %d", kind, r.Size())
			}
			b := r.Bytes()
			for i := range b {
				if b[i] != 0 {
					t.Fatalf("%s: fresh memory not zero at %d", kind, i)
				}
			}
			for i := 0; i < len(b); i += 4093 {
				b[i] = byte(i)
			}
			for i := 0; i < len(b); i += 4093 {
				if b[i] != byte(i) {
					t.Fatalf("%s: readback mismatch at %d", kind, i)
				}
			}
			if (kind == Shm) != (r.Fd() >= 0) {
				t.Fatalf("%s: fd %d", kind, r.Fd())
			}
			if err := r.Close(); err != nil {
				t.Fatalf("%s: close: %v", kind, err)
			}
			if err := r.Close(); !errors.Is(err, ErrClosed) {
				t.Fatalf("%s: second close = %v, want ErrClosed", kind, err)
			}
			if r.Bytes() != nil || !r.Closed() {
				t.Fatalf("%s: closed region still exposes memory", kind)
			}
		}
	}
}

func TestShmRegionIsSharedAndSealed(t *testing.T) {
	a := newTestAllocator(t, Config{Kind: Shm, Prefault: true})
	r, err := a.Allocate("shared", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	fd := r.Fd()
	// A second mapping of the same fd, as the node service makes, sees the same bytes.
	other, err := unix.Mmap(fd, 0, int(r.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	r.Bytes()[100] = 42
	other[200] = 7
	if other[100] != 42 || r.Bytes()[200] != 7 {
		t.Fatal("memfd mappings do not share pages")
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		t.Fatal(err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 || seals&unix.F_SEAL_GROW == 0 {
		t.Fatalf("memfd seals %#x lack shrink/grow", seals)
	}
	if err := unix.Ftruncate(fd, 4096); err == nil {
		t.Fatal("sealed memfd could be shrunk")
	}
	if err := unix.Munmap(other); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Fatalf("memfd still open after Close: %v", err)
	}
}

func TestHugeTLBFallsBackWithWarning(t *testing.T) {
	var logs bytes.Buffer
	cfg := DefaultConfig(HugeTLB)
	cfg.ReserveBytes = 0
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	a := newTestAllocator(t, cfg)
	// Ask for more huge pages than any test machine reserves.
	r, err := a.Allocate("huge", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.HugeTLB() {
		if r.Kind() != HugeTLB {
			t.Fatalf("hugetlb region reports kind %s", r.Kind())
		}
		t.Log("kernel had huge pages; fallback not exercised by this allocation")
		return
	}
	if r.Kind() != Mmap {
		t.Fatalf("fallback region kind %s, want mmap", r.Kind())
	}
	if !strings.Contains(logs.String(), "hugetlb pages unavailable") || !strings.Contains(logs.String(), "vm.nr_hugepages") {
		t.Fatalf("fallback logged %q", logs.String())
	}
}

func TestRefusesMoreThanAvailableMinusReserve(t *testing.T) {
	a := newTestAllocator(t, Config{Kind: Mmap, ReserveBytes: 1 << 30})
	a.avail = func() (int64, error) { return 3 << 30, nil }
	if _, err := a.Allocate("too-big", 2<<30+4096); !errors.Is(err, ErrNoMemory) {
		t.Fatalf("allocation past reserve: %v, want ErrNoMemory", err)
	} else if !strings.Contains(err.Error(), "reserved") {
		t.Fatalf("error does not explain the reserve: %v", err)
	}
	r, err := a.Allocate("fits", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	// Unprefaulted regions count against availability until closed.
	lazy := newTestAllocator(t, Config{Kind: Mmap, ReserveBytes: 0})
	lazy.avail = func() (int64, error) { return 100 << 20, nil }
	r1, err := lazy.Allocate("first", 60<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lazy.Allocate("second", 60<<20); !errors.Is(err, ErrNoMemory) {
		t.Fatalf("second lazy allocation: %v, want ErrNoMemory", err)
	}
	r1.Close()
	r2, err := lazy.Allocate("second", 60<<20)
	if err != nil {
		t.Fatalf("after closing the first: %v", err)
	}
	r2.Close()
	// The real machine check refuses something absurd.
	real := newTestAllocator(t, DefaultConfig(Mmap))
	if _, err := real.Allocate("absurd", 1<<50); !errors.Is(err, ErrNoMemory) {
		t.Fatalf("1 PiB allocation: %v", err)
	}
}

func TestBadConfigAndSizes(t *testing.T) {
	if _, err := New(Config{Kind: "tmpfs"}); !errors.Is(err, ErrConfig) {
		t.Fatalf("unknown kind: %v", err)
	}
	if _, err := New(Config{Kind: Mmap, ReserveBytes: -1}); !errors.Is(err, ErrConfig) {
		t.Fatalf("negative reserve: %v", err)
	}
	a := newTestAllocator(t, Config{Kind: Mmap})
	for _, n := range []int64{0, -5} {
		if _, err := a.Allocate("bad", n); !errors.Is(err, ErrConfig) {
			t.Fatalf("size %d: %v", n, err)
		}
	}
}

func TestMlock(t *testing.T) {
	a := newTestAllocator(t, Config{Kind: Mmap, Prefault: true, Mlock: true})
	r, err := a.Allocate("locked", 1<<20)
	if err != nil {
		if !errors.Is(err, ErrMap) || !strings.Contains(err.Error(), "ulimit -l") {
			t.Fatalf("mlock failure without advice: %v", err)
		}
		return
	}
	defer r.Close()
	if !r.Locked() {
		t.Fatal("region not marked locked")
	}
}

func TestRegionsStayOffTheGoHeap(t *testing.T) {
	a := newTestAllocator(t, Config{Kind: Shm, Prefault: true})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	r, err := a.Allocate("heap-check", 256<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 1<<20 {
		t.Fatalf("a 256 MiB region grew the Go heap by %d bytes", grew)
	}
}

func TestConcurrentAllocateAndClose(t *testing.T) {
	a := newTestAllocator(t, Config{Kind: Shm, ReserveBytes: 0})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				r, err := a.Allocate("c", 64<<10)
				if err != nil {
					t.Error(err)
					return
				}
				r.Bytes()[0] = 1
				var cw sync.WaitGroup
				errs := make(chan error, 2)
				for j := 0; j < 2; j++ {
					cw.Add(1)
					go func() { defer cw.Done(); errs <- r.Close() }()
				}
				cw.Wait()
				close(errs)
				ok := 0
				for err := range errs {
					if err == nil {
						ok++
					} else if !errors.Is(err, ErrClosed) {
						t.Error(err)
					}
				}
				if ok != 1 {
					t.Errorf("%d closes succeeded, want exactly 1", ok)
				}
			}
		}()
	}
	wg.Wait()
}

func TestFormatBytesAndParseKind(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 4 << 30: "4.0 GiB", 3 << 19: "1.5 MiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
	if k, err := ParseKind("SHM"); err != nil || k != Shm {
		t.Errorf("ParseKind(SHM) = %v, %v", k, err)
	}
}
