package spill

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/internal/vecio"
	"github.com/stratakv/strata/storage"
)

// Removed objects stay removed after a crash that loses everything still
// staged: RemoveObjects and RemoveObject return once their tombstones are
// written. (Before, a tombstone waited in the write buffer, and a crash
// brought the object back.)
func TestRemoveSurvivesCrash(t *testing.T) {
	cfg := testConfig(t.TempDir())
	s := open(t, cfg)
	const n = 40
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
		put(t, s, keys[i], data(5000, i))
	}
	s.flush()
	had, err := s.RemoveObjects(bg, append(keys[:30:30], "never-put"))
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range had {
		if h != (i < 30) {
			t.Fatalf("remove of %d keys: had %v", len(had), had)
		}
	}
	for _, k := range keys[30:35] {
		if had, err := s.RemoveObject(bg, k); !had || err != nil {
			t.Fatalf("remove %s: %v %v", k, had, err)
		}
	}
	put(t, s, "staged", data(5000, 99)) // lost by the crash: puts are not durable
	s.crash()
	s = open(t, cfg)
	for i, k := range keys {
		if i < 35 {
			mustMiss(t, s, k, 5000)
		} else {
			mustGet(t, s, k, data(5000, i))
		}
	}
	if st := s.Stats(); st.Objects != n-35 {
		t.Fatalf("%d objects after the crash, want %d", st.Objects, n-35)
	}
}

// The same with the service killed for real (SIGKILL) right after the
// removes returned: the tombstones are in the files, not in the process.
func TestRemoveSurvivesSIGKILL(t *testing.T) {
	const keys = 20
	if dir := os.Getenv("STRATA_SPILL_KILL_DIR"); dir != "" {
		// The child: remove half of the keys, say so, and wait to be killed.
		s, err := New(testConfig(dir))
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		var ks []string
		for i := 0; i < keys; i += 2 {
			ks = append(ks, fmt.Sprintf("k%d", i))
		}
		if _, err := s.RemoveObjects(bg, ks); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		if err := s.PutObject(bg, "staged", 7, data(5000, 1)); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("removed")
		time.Sleep(time.Hour)
	}
	cfg := testConfig(t.TempDir())
	s := open(t, cfg)
	for i := 0; i < keys; i++ {
		put(t, s, fmt.Sprintf("k%d", i), data(5000, i))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRemoveSurvivesSIGKILL$", "-test.count=1")
	cmd.Env = append(os.Environ(), "STRATA_SPILL_KILL_DIR="+cfg.Dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l := sc.Text(); l == "removed" || strings.HasPrefix(l, "error:") {
				lines <- l
				return
			}
		}
		lines <- "the child ended without removing"
	}()
	if l := wait(t, lines, "the child's removes"); l != "removed" {
		t.Fatal(l)
	}
	if err := cmd.Process.Signal(unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	s = open(t, cfg)
	for i := 0; i < keys; i++ {
		if i%2 == 0 {
			mustMiss(t, s, fmt.Sprintf("k%d", i), 5000)
		} else {
			mustGet(t, s, fmt.Sprintf("k%d", i), data(5000, i))
		}
	}
}

// A batch of removes costs one buffer write, not one per key.
func TestRemoveBatchOneWrite(t *testing.T) {
	s := open(t, testConfig(t.TempDir()))
	var keys []string
	for i := 0; i < 100; i++ {
		keys = append(keys, fmt.Sprintf("k%d", i))
		put(t, s, keys[i], data(3000, i))
	}
	s.flush()
	before := s.Stats().Flushes
	had, err := s.RemoveObjects(bg, keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range had {
		if !h {
			t.Fatalf("remove of %s: not there", keys[i])
		}
	}
	// 100 tombstones of 512 bytes fit one 64 KiB buffer.
	if st := s.Stats(); st.Flushes != before+1 || st.Removed != 100 || st.Objects != 0 {
		t.Fatalf("flushes %d -> %d for a batch of removes; stats %+v", before, st.Flushes, st)
	}
}

// A tombstone that cannot be written: the object is removed all the same
// (no read serves it), and the error says it may be back after a restart.
func TestRemoveNotDurable(t *testing.T) {
	s := open(t, testConfig(t.TempDir()))
	put(t, s, "a", data(5000, 1))
	put(t, s, "b", data(5000, 2))
	s.flush()
	var fail atomic.Bool
	fail.Store(true)
	s.locked(func() {
		s.pwritev = func(fd int, iovs [][]byte, off int64) (int, error) {
			if fail.Load() {
				return 0, unix.EIO
			}
			return vecio.Pwritev(fd, iovs, off)
		}
	})
	had, err := s.RemoveObjects(bg, []string{"a", "b", "never-put"})
	if !errors.Is(err, ErrRemoveNotDurable) || !errors.Is(err, storage.ErrIO) {
		t.Fatalf("remove on a failing device: %v", err)
	}
	if !had[0] || !had[1] || had[2] {
		t.Fatalf("had %v", had)
	}
	mustMiss(t, s, "a", 5000)
	mustMiss(t, s, "b", 5000)
	if st := s.Stats(); st.RemovesNotDurable != 2 || st.Removed != 2 {
		t.Fatalf("stats %+v", st)
	}
	fail.Store(false)
	if had, err := s.RemoveObject(bg, "a"); had || err != nil {
		t.Fatalf("a second remove: %v %v", had, err)
	}
}

// A remove while a put of the key is still copying its bytes in (in the
// node service, the object being evicted from the arena to the spill) removes
// that object too: its tombstone follows the put's record, the put succeeds
// with its object removed, and the object stays removed after a restart. A
// second put of the key during the first is skipped (the first stores it).
func TestRemoveDuringPut(t *testing.T) {
	cfg := testConfig(t.TempDir())
	s := open(t, cfg)
	hold, reached, release := holdAt("put-copy", "k")
	placed := make(chan struct{})
	var once sync.Once
	s.setHook(func(p, k string) {
		hold(p, k)
		if p == "remove-copy" && k == "k" {
			once.Do(func() { close(placed) })
		}
	})
	putErr := make(chan error, 1)
	go func() { putErr <- s.PutObject(bg, "k", 7, data(5000, 1)) }()
	wait(t, reached, "the put's copy")
	var getErr, put2Err error
	within(t, time.Minute, "calls while a put is held mid-copy", func() {
		_, getErr = get(s, "k", 5000)
		put2Err = s.PutObject(bg, "k", 7, data(5000, 2))
	})
	if !errors.Is(getErr, storage.ErrNotFound) || put2Err != nil {
		t.Fatalf("during the put: get %v (want not found), a second put %v", getErr, put2Err)
	}
	type result struct {
		had bool
		err error
	}
	removed := make(chan result, 1)
	go func() {
		had, err := s.RemoveObject(bg, "k")
		removed <- result{had, err}
	}()
	// The remove's tombstone is placed while the put still copies; the
	// remove returns once it is written, after the put's copy.
	wait(t, placed, "the remove's tombstone")
	close(release)
	if err := wait(t, putErr, "the put"); err != nil {
		t.Fatal(err)
	}
	if r := wait(t, removed, "the remove"); !r.had || r.err != nil {
		t.Fatalf("remove during the put: %v %v, want the object removed", r.had, r.err)
	}
	mustMiss(t, s, "k", 5000)
	if st := s.Stats(); st.Writes != 1 || st.WritesSkipped != 1 || st.Removed != 1 || st.Objects != 0 {
		t.Fatalf("stats %+v", st)
	}
	put(t, s, "k", data(6000, 3)) // after the tombstone: stored again
	s.flush()
	s.crash()
	s = open(t, cfg)
	mustGet(t, s, "k", data(6000, 3))
	if had, err := s.RemoveObject(bg, "k"); !had || err != nil {
		t.Fatalf("remove: %v %v", had, err)
	}
	s.crash()
	s = open(t, cfg)
	mustMiss(t, s, "k", 6000)
}

// A put while a remove of the key is still copying its tombstone in: the key
// is forgotten already, so the put stores it, after the tombstone in the
// file, and it is there after a restart.
func TestPutDuringRemove(t *testing.T) {
	cfg := testConfig(t.TempDir())
	s := open(t, cfg)
	put(t, s, "k", data(5000, 1))
	s.flush()
	hook, reached, release := holdAt("remove-copy", "k")
	s.setHook(hook)
	type result struct {
		had bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		had, err := s.RemoveObject(bg, "k")
		done <- result{had, err}
	}()
	wait(t, reached, "the remove's copy")
	var getErr, putErr error
	var got []byte
	within(t, time.Minute, "calls while a remove is held mid-copy", func() {
		_, getErr = get(s, "k", 5000)
		putErr = s.PutObject(bg, "k", 7, data(6000, 2))
		got, _ = get(s, "k", 6000)
	})
	if !errors.Is(getErr, storage.ErrNotFound) || putErr != nil || string(got) != string(data(6000, 2)) {
		t.Fatalf("during the remove: get %v, put %v, then the put's bytes: %v", getErr, putErr, string(got) == string(data(6000, 2)))
	}
	close(release)
	if r := wait(t, done, "the remove"); !r.had || r.err != nil {
		t.Fatalf("remove: %v %v", r.had, r.err)
	}
	mustGet(t, s, "k", data(6000, 2))
	s.flush()
	s.crash()
	s = open(t, cfg)
	mustGet(t, s, "k", data(6000, 2))
}

// A panic in a call made under the spill's mutex (a bug) leaves the spill
// closable: the mutex is released on the way out, later calls fail at once
// saying why, and Close returns, with an error, instead of waiting for the
// buffer the call held.
func TestPanicUnderLock(t *testing.T) {
	for _, point := range []string{"put-placed-locked", "put-commit-locked"} {
		t.Run(point, func(t *testing.T) {
			s := open(t, testConfig(t.TempDir()))
			put(t, s, "before", data(1000, 1))
			s.setHook(func(p, key string) {
				if p == point && key == "boom" {
					panic("injected at " + point)
				}
			})
			func() {
				defer func() {
					if r := recover(); r == nil {
						t.Fatal("the put did not panic")
					}
				}()
				_ = s.PutObject(bg, "boom", 7, data(1000, 2))
			}()
			var putErr, closeErr error
			within(t, time.Minute, "calls after a panic under the lock", func() {
				putErr = s.PutObject(bg, "after", 7, data(1000, 3))
				_ = s.Stats()
				closeErr = s.Close()
			})
			if !errors.Is(putErr, storage.ErrIO) || !strings.Contains(putErr.Error(), "panicked") {
				t.Fatalf("a put after the panic: %v", putErr)
			}
			if closeErr == nil || !strings.Contains(closeErr.Error(), "panicked") {
				t.Fatalf("Close after a panic: %v", closeErr)
			}
		})
	}
}
