package arena

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Truncation (fault.go). Whoever may write the arena file can truncate it
// while the arena serves; the arena must not die of it (SIGBUS), must never
// serve what it lost, and must say so once. The tests truncate the file from
// the test while goroutines put and get, and during recovery, the warm-up and
// Close; with the watcher (inotify) and without it (faults alone).

// syncBuffer is a log a test reads while the arena writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// logTo sends cfg's log to a buffer, and returns it.
func logTo(cfg *Config) *syncBuffer {
	log := &syncBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(log, nil))
	return log
}

// guardedCopy copies as the node service copies a client's bytes: under
// panic-on-fault, handing a fault in the arena's memory to HandleFault.
func guardedCopy(a *Arena, dst, src []byte) (faulted bool) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			f, ok := r.(interface{ Addr() uintptr })
			if !ok || !a.HandleFault(f.Addr()) {
				panic(r)
			}
			faulted = true
		}
	}()
	copy(dst, src)
	return false
}

// within fails the test unless fn returns within 20 s.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not return within 20 s", what)
	}
}

// waitBroken waits, at most 20 s, for a to break.
func waitBroken(t *testing.T, a *Arena) {
	t.Helper()
	waitFor(t, "the arena to break", func() bool { return a.Err() != nil })
}

// expectBroken checks what a broken arena answers, its log, and that a new
// arena on the emptied file starts empty and works.
// why is what Err must say: "truncated" when the watcher found it, "faulted"
// when a touch did; "" takes either (the watcher and a touch race).
func expectBroken(t *testing.T, a *Arena, cfg Config, log *syncBuffer, key, why string) {
	t.Helper()
	err := a.Err()
	if !errors.Is(err, ErrBroken) || why != "" && !strings.Contains(err.Error(), why) {
		t.Fatalf("Err of the broken arena: %v, want ErrBroken saying %q", err, why)
	}
	if _, err := a.Reserve("new-after", 1, 5000); !errors.Is(err, ErrBroken) {
		t.Fatalf("Reserve: %v, want ErrBroken", err)
	}
	if _, err := a.Acquire(key, 1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Acquire of %s: %v, want a miss", key, err)
	}
	leases, errs := make([]Lease, 1), make([]error, 1)
	if err := a.AcquireInto([]string{key}, 1, leases, errs); err != nil || !errors.Is(errs[0], ErrNotFound) {
		t.Fatalf("AcquireInto of %s: %v, %v; want a miss", key, err, errs[0])
	}
	if a.Contains(key, 1) || a.ContainsPrefix([]string{key}, 1) != 0 {
		t.Fatalf("%s is still contained", key)
	}
	within(t, "Remove", func() {
		if a.Remove(key) {
			t.Errorf("Remove of %s in a broken arena removed something", key)
		}
	})
	within(t, "Await", func() {
		if waited, err := a.Await(context.Background(), key); waited || err != nil {
			t.Errorf("Await: %v, %v", waited, err)
		}
	})
	within(t, "Ready", func() { <-a.Ready() })
	if st := a.Stats(); st.Broken != err.Error() || st.BrokenAt.IsZero() {
		t.Fatalf("Stats: broken %q at %v", st.Broken, st.BrokenAt)
	}
	if st, err := os.Stat(cfg.File); err != nil || st.Size() != 0 {
		t.Fatalf("the arena file was not emptied: %v, %v", st.Size(), err)
	}
	// The flag flips before breakArena logs (it replaces the file between):
	// Err can say broken a moment before the line is written.
	waitFor(t, "the arena's broken line in its log", func() bool { return strings.Contains(log.String(), "arena broken") })
	if n := strings.Count(log.String(), "arena broken"); n != 1 {
		t.Fatalf("%d log lines say the arena broke, want 1:\n%s", n, log.String())
	}
	within(t, "Close", func() { _ = a.Close() })
	b := newArena(t, cfg)
	if st := b.Stats().Recovery; st.Warm || !strings.Contains(st.Cold, "new arena file") {
		t.Fatalf("the restart after a break: %+v", st)
	}
	put(t, b, "after", 1, 30000)
	read(t, b, "after", 1, 30000)
	mustCheck(t, b)
}

func TestFileTruncatedWhileServing(t *testing.T) {
	for _, c := range []struct {
		name  string
		to    func(size int64) int64
		watch bool
	}{
		{"to zero, watched", func(int64) int64 { return 0 }, true},
		{"to half, watched", func(n int64) int64 { return n / 2 }, true},
		{"to zero, faults alone", func(int64) int64 { return 0 }, false},
		{"to half, faults alone", func(n int64) int64 { return n / 2 }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(shmDir(t), "a")
			cfg := fileConfig(t, path, 16<<20)
			cfg.noWatch = !c.watch
			log := logTo(&cfg)
			a, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = a.Close() })
			if a.HandleFault(1 << 12) {
				t.Fatal("HandleFault took an address outside the arena")
			}
			sizes := []int{100, 3000, 20000, 70000}
			patterns := map[string][]byte{}
			for w := range 4 {
				for i := range 48 * len(sizes) {
					k := fmt.Sprintf("w%d-%d", w, i%48)
					size := sizes[(i/48+w)%len(sizes)]
					patterns[fmt.Sprintf("%s/%d", k, size)] = pattern(k, size)
				}
			}
			put(t, a, "first", 1, 20000)

			var ops, corrupt, faults atomic.Int64
			var unexpected sync.Map
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for w := range 4 {
				wg.Go(func() {
					buf := make([]byte, 70000)
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						k := fmt.Sprintf("w%d-%d", w, i%48)
						size := sizes[(i/48+w)%len(sizes)]
						want := patterns[fmt.Sprintf("%s/%d", k, size)]
						if p, err := a.Reserve(k, 1, int64(size)); err == nil {
							if guardedCopy(a, p.Bytes(), want) {
								faults.Add(1)
								p.Abort()
							} else if err := p.Commit(); err != nil && !errors.Is(err, ErrBroken) {
								unexpected.Store(err.Error(), true)
							}
						} else if !errors.Is(err, ErrExists) && !errors.Is(err, ErrBroken) && !errors.Is(err, ErrNoSpace) {
							unexpected.Store(err.Error(), true)
						}
						if l, err := a.Acquire(k, 1); err == nil {
							got := buf[:len(l.Bytes())]
							if guardedCopy(a, got, l.Bytes()) {
								faults.Add(1)
							} else if a.Err() == nil && !bytes.Equal(got, patterns[fmt.Sprintf("%s/%d", k, len(got))]) {
								corrupt.Add(1) // served as the object: it must be the object
							}
							l.Release()
						} else if !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrBroken) {
							unexpected.Store(err.Error(), true)
						}
						if i%7 == 0 {
							a.Remove(k)
						}
						ops.Add(1)
					}
				})
			}
			waitFor(t, "puts and gets", func() bool { return ops.Load() > 300 })
			st, err := os.Stat(path)
			must(t, err)
			must(t, os.Truncate(path, c.to(st.Size())))
			waitBroken(t, a)
			at := ops.Load()
			waitFor(t, "calls on the broken arena", func() bool { return ops.Load() > at+300 })
			close(stop)
			within(t, "the workers", wg.Wait)

			unexpected.Range(func(k, _ any) bool { t.Errorf("unexpected error: %v", k); return true })
			if corrupt.Load() > 0 {
				t.Fatalf("%d reads served bytes that are not the object's", corrupt.Load())
			}
			why := "" // the watcher, or a touch before it
			if !c.watch {
				why = "faulted"
			}
			expectBroken(t, a, cfg, log, "first", why)
			t.Logf("%d operations, %d copies faulted", ops.Load(), faults.Load())
		})
	}
}

// A truncation while a restart recovers the file's objects ends recovery:
// the arena breaks, its start ends, and removals that wait for recovery
// return.
func TestFileTruncatedDuringRecovery(t *testing.T) {
	for _, watch := range []bool{true, false} {
		t.Run(fmt.Sprintf("watch=%v", watch), func(t *testing.T) {
			path := filepath.Join(shmDir(t), "a")
			cfg := fileConfig(t, path, 16<<20)
			a := newArena(t, cfg)
			_, keys := fill(t, a, 300)
			must(t, a.Close())

			cfg.noWatch = !watch
			log := logTo(&cfg)
			var once sync.Once
			cfg.recoverStep = func(n int) {
				if n >= 1 {
					once.Do(func() {
						if err := os.Truncate(path, 0); err != nil {
							t.Error(err)
						}
					})
				}
			}
			b, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close() })
			within(t, "AwaitRecovered", func() { _ = b.AwaitRecovered(context.Background()) })
			waitBroken(t, b)
			why := ""
			if !watch {
				why = "faulted"
			}
			expectBroken(t, b, cfg, log, keys[0], why)
		})
	}
}

// A truncation during the warm-up: the memory it could not populate is left
// unused, and the first touch of what is gone breaks the arena (the watcher
// breaks it at once).
func TestFileTruncatedDuringWarmup(t *testing.T) {
	for _, watch := range []bool{true, false} {
		t.Run(fmt.Sprintf("watch=%v", watch), func(t *testing.T) {
			path := filepath.Join(shmDir(t), "a")
			cfg := fileConfig(t, path, 128<<20)
			cfg.Warmup, cfg.noWatch = true, !watch
			log := logTo(&cfg)
			var once sync.Once
			cfg.OnWarmup = func(ready, _ int64) {
				once.Do(func() {
					if err := os.Truncate(path, 0); err != nil {
						t.Error(err)
					}
				})
			}
			a, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = a.Close() })
			within(t, "Ready", func() { <-a.Ready() })
			if !watch {
				// Faults alone: the first object placed in what is gone.
				if _, err := a.Reserve("k", 1, 5000); !errors.Is(err, ErrBroken) {
					t.Fatalf("Reserve in a truncated file: %v, want ErrBroken", err)
				}
			}
			waitBroken(t, a)
			why := "truncated" // the warm-up touches nothing
			if !watch {
				why = "faulted"
			}
			expectBroken(t, a, cfg, log, "k", why)
		})
	}
}

// A file truncated under an arena that nothing touches until Close: Close
// does not fault writing the superblock, says so, and leaves the file empty.
func TestFileTruncatedBeforeClose(t *testing.T) {
	path := filepath.Join(shmDir(t), "a")
	cfg := fileConfig(t, path, 8<<20)
	cfg.noWatch = true
	a := newArena(t, cfg)
	put(t, a, "k", 1, 3000)
	must(t, os.Truncate(path, 0))
	var err error
	within(t, "Close", func() { err = a.Close() })
	if !errors.Is(err, ErrBroken) || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("Close of an arena whose file was truncated: %v", err)
	}
	if st, err := os.Stat(path); err != nil || st.Size() != 0 {
		t.Fatalf("the arena file was not left empty: %v", err)
	}
	b := newArena(t, cfg)
	if st := b.Stats().Recovery; st.Warm {
		t.Fatalf("the file was recovered after a truncation: %+v", st)
	}
}
