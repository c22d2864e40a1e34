package arena

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// placeOf is where key's slot and bytes lie in the data region.
func placeOf(t *testing.T, a *Arena, key string) (slot, end, at int64) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	idx := a.lookupLocked(key, hashOf(a, key))
	if idx == 0 {
		t.Fatalf("%s is not in the arena", key)
	}
	r := a.rec(idx)
	return r.off, a.slotEnd(r), a.bytesOff(r)
}

// flip flips one bit of the arena file at byte off of its data region.
func flip(t *testing.T, path string, dataOff, off int64, bit uint) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, dataOff+off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 1 << bit
	if _, err := f.WriteAt(b, dataOff+off); err != nil {
		t.Fatal(err)
	}
}

// holdFirstSeal makes cfg's arena hold its sealer after it hashed its first
// batch: entered says it is held, closing release lets it go on. A test that
// fails first lets it go too, so that its arena's Close does not hang.
func holdFirstSeal(t *testing.T, cfg *Config) (entered, release chan struct{}) {
	entered, release = make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	ctx := t.Context()
	cfg.sealHashed = func() {
		once.Do(func() {
			entered <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
		})
	}
	return entered, release
}

// untilSealed waits, within a bound, until the sealer has sealed every
// object committed so far.
func untilSealed(t *testing.T, a *Arena) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for a.Stats().Unsealed != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the sealer did not seal the queue in 10 s: %+v", a.Stats())
		}
		time.Sleep(time.Millisecond)
	}
}

// One flipped bit anywhere in an object (a large object's bytes, which its
// seal covers, its descriptor or seal word, a small object's bytes or
// trailer) is found by the restart: the object is dropped and counted, never
// served, and never handed to OnEvict; the others are served, and evicted
// with their own bytes.
func TestARestartNeverServesAFlippedBit(t *testing.T) {
	type where int
	const (
		inBytes where = iota
		inLastByte
		inTrailer
		inDescriptor
		inSeal
	)
	for _, c := range []struct {
		name    string
		size    int
		where   where
		badSeal bool
	}{
		{"4KiB-first-byte", 4096, inBytes, true},
		{"64KiB-last-byte", 64 << 10, inLastByte, true},
		{"2MiB-middle", 2 << 20, inBytes, true},
		{"64KiB-seal-word", 64 << 10, inSeal, true},
		{"64KiB-descriptor", 64 << 10, inDescriptor, false},
		{"64KiB-trailer", 64 << 10, inTrailer, false},
		{"small-bytes", 1000, inBytes, false},
		{"small-trailer", 1000, inTrailer, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(shmDir(t), "a")
			cfg := fileConfig(t, path, 64<<20)
			a := newArena(t, cfg)
			keys := make([]string, 8)
			for i := range keys {
				keys[i] = fmt.Sprintf("%s-%d", c.name, i)
				put(t, a, keys[i], 1, c.size)
			}
			untilSealed(t, a)
			victim := keys[3]
			_, end, at := placeOf(t, a, victim)
			dataOff := a.back.geo.dataOff
			crash(t, a)
			switch c.where {
			case inBytes: // the first byte of a page, or the middle of a larger object
				off := at
				if c.size > 4096 {
					off += int64(c.size) / 2
				}
				flip(t, path, dataOff, off, 3)
			case inLastByte:
				flip(t, path, dataOff, at+int64(c.size)-1, 7)
			case inTrailer:
				flip(t, path, dataOff, trailerAt(end)+9, 0) // the commit sequence
			case inDescriptor:
				flip(t, path, dataOff, end-descAt+8, 1) // the size
			case inSeal:
				flip(t, path, dataOff, end-descBytes+5, 2)
			}

			cfg2 := cfg
			log := logTo(&cfg2)
			var mu sync.Mutex
			evicted := map[string]bool{}
			cfg2.OnEvict = func(e Evicted) bool {
				mu.Lock()
				defer mu.Unlock()
				evicted[e.Key] = true
				if e.Key != victim && !bytes.Equal(e.Bytes, pattern(e.Key, c.size)) && strings.HasPrefix(e.Key, c.name) {
					t.Errorf("%s evicted with other bytes than it was put with", e.Key)
				}
				return true
			}
			b := newArena(t, cfg2)
			waitRecovered(t, b)
			if _, err := b.Acquire(victim, 1); !errors.Is(err, ErrNotFound) {
				t.Fatalf("the damaged %s: %v, want a miss", victim, err)
			}
			for _, k := range keys {
				if k != victim {
					read(t, b, k, 1, c.size)
				}
			}
			st := b.Stats().Recovery
			if st.Lost != 1 || st.Recovered != int64(len(keys)-1) || (st.BadSeals == 1) != c.badSeal || st.Unsealed != 0 {
				t.Fatalf("recovery %+v: want 1 lost (bad seal %v), %d recovered", st, c.badSeal, len(keys)-1)
			}
			if !strings.Contains(log.String(), "damaged objects") {
				t.Fatalf("the damage was not logged:\n%s", log)
			}
			mustCheck(t, b)
			// New objects push every old one out, through OnEvict.
			for i := range 64 {
				put(t, b, fmt.Sprintf("new-%d", i), 1, 2<<20)
			}
			mu.Lock()
			defer mu.Unlock()
			if evicted[victim] {
				t.Fatalf("the damaged %s was handed to OnEvict", victim)
			}
			for _, k := range keys {
				if k != victim && !evicted[k] {
					t.Fatalf("%s was never evicted: %d evictions", k, len(evicted))
				}
			}
		})
	}
}

// A kill before the sealer reached an object: the restart cannot check its
// bytes, drops it and says how many, and warns; a sealed one and a small one
// (which its check word covers) are served.
func TestAKillBeforeItsSealDropsTheObjectAndSaysSo(t *testing.T) {
	path := filepath.Join(shmDir(t), "a")
	cfg := fileConfig(t, path, 64<<20)
	entered, release := holdFirstSeal(t, &cfg)
	a := newArena(t, cfg)
	put(t, a, "sealed", 1, 64<<10)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the sealer never hashed the first object")
	}
	// Hashed and its seal not stored: a kill now would lose it too, so it
	// counts, though it left the queue.
	if n := a.Stats().Unsealed; n != 1 {
		t.Fatalf("Stats().Unsealed %d with the held sealer's object not stored", n)
	}
	for i := range 3 {
		put(t, a, fmt.Sprintf("unsealed-%d", i), 1, 64<<10)
	}
	put(t, a, "small", 1, 1000)
	if n := a.Stats().Unsealed; n != 4 {
		t.Fatalf("Stats().Unsealed %d with 3 objects queued behind the held sealer and its own", n)
	}
	a.mu.Lock()
	a.seal.abandon = true // as a kill would: the queue is never sealed
	a.mu.Unlock()
	close(release)
	crash(t, a)

	cfg2 := fileConfig(t, path, 64<<20)
	log := logTo(&cfg2)
	b := newArena(t, cfg2)
	waitRecovered(t, b)
	read(t, b, "sealed", 1, 64<<10)
	read(t, b, "small", 1, 1000)
	for i := range 3 {
		if _, err := b.Acquire(fmt.Sprintf("unsealed-%d", i), 1); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unsealed-%d: %v, want a miss", i, err)
		}
	}
	st := b.Stats().Recovery
	if st.Unsealed != 3 || st.Lost != 0 || st.Recovered != 2 || st.UnfinishedWrites != 0 {
		t.Fatalf("recovery %+v: want 3 unsealed, none lost, 2 recovered, no unfinished writes", st)
	}
	if !strings.Contains(log.String(), "not sealed yet") {
		t.Fatalf("the unsealed objects were not logged:\n%s", log)
	}
	mustCheck(t, b)
}

// Close seals what the sealer had not reached before it marks the file
// clean: a clean restart recovers every object.
func TestCloseSealsEveryObject(t *testing.T) {
	path := filepath.Join(shmDir(t), "a")
	cfg := fileConfig(t, path, 256<<20)
	entered, release := holdFirstSeal(t, &cfg)
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	put(t, a, "first", 1, 64<<10)
	<-entered
	for i := range 40 {
		put(t, a, fmt.Sprintf("k%d", i), 1, 1<<20)
	}
	close(release)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b := newArena(t, fileConfig(t, path, 256<<20))
	waitRecovered(t, b)
	st := b.Stats().Recovery
	if !st.PreviousClean || st.Recovered != 41 || st.Unsealed != 0 || st.Lost != 0 {
		t.Fatalf("recovery after Close %+v: want 41 recovered, clean", st)
	}
	for i := range 40 {
		read(t, b, fmt.Sprintf("k%d", i), 1, 1<<20)
	}
}

// A Remove, and a new object in the freed space, while the sealer hashes the
// removed one: its seal is thrown away (the bytes it hashed may be the new
// object's), the removed object stays gone after a restart, and the new one
// is sealed and served.
func TestARemoveWhileTheSealerHashesIt(t *testing.T) {
	path := filepath.Join(shmDir(t), "a")
	cfg := fileConfig(t, path, 64<<20)
	entered, release := holdFirstSeal(t, &cfg)
	a := newArena(t, cfg)
	put(t, a, "old", 1, 64<<10)
	select {
	case <-entered: // "old" is hashed, its seal not stored yet
	case <-time.After(10 * time.Second):
		t.Fatal("the sealer never hashed the object")
	}
	_, _, oldAt := placeOf(t, a, "old")
	if !a.Remove("old") {
		t.Fatal("Remove of old removed nothing")
	}
	put(t, a, "new", 1, 64<<10) // the freed extent, most likely
	_, _, newAt := placeOf(t, a, "new")
	close(release)
	untilSealed(t, a)
	if st := a.Stats(); st.SealSkipped != 1 || st.Sealed != 1 {
		t.Fatalf("sealer %+v: want old's seal thrown away and new sealed", st)
	}
	crash(t, a)
	b := newArena(t, fileConfig(t, path, 64<<20))
	waitRecovered(t, b)
	if _, err := b.Acquire("old", 1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the removed object after a restart: %v, want a miss", err)
	}
	read(t, b, "new", 1, 64<<10)
	if st := b.Stats().Recovery; st.Recovered != 1 || st.Lost != 0 || st.Unsealed != 0 {
		t.Fatalf("recovery %+v (old at %d, new at %d)", st, oldAt, newAt)
	}
	mustCheck(t, b)
}

// While recovery is held before it reads a slab, nothing of it is served:
// a large object is a miss until its seal is checked, then a hit.
func TestNothingIsServedBeforeItsSealIsChecked(t *testing.T) {
	path := filepath.Join(shmDir(t), "a")
	cfg := fileConfig(t, path, 64<<20)
	a := newArena(t, cfg)
	put(t, a, "k", 1, 64<<10)
	untilSealed(t, a)
	crash(t, a)
	held, release := make(chan struct{}, 2), make(chan struct{})
	cfg2 := fileConfig(t, path, 64<<20)
	cfg2.recoverStep = func(n int) {
		if n == 0 {
			held <- struct{}{}
			<-release
		}
	}
	b := newArena(t, cfg2)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("recovery never started")
	}
	if _, err := b.Acquire("k", 1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Acquire before the seal was checked: %v, want a miss", err)
	}
	if b.Contains("k", 1) {
		t.Fatal("Contains reports an object whose seal was not checked")
	}
	close(release)
	waitRecovered(t, b)
	read(t, b, "k", 1, 64<<10)
}
