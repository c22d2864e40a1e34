package spill

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stratakv/strata/storage"
)

// A staged record (a 512-byte header, so its data starts off the 4 KiB grid)
// is read straight into aligned memory where the device's O_DIRECT alignment
// is a sector, through the window otherwise, and in runs: the same bytes
// every way, and damage in the data's whole sectors or in its partial last
// one is caught on either path.
func TestReadPaths(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.SegmentBytes = 64 << 20
	s := open(t, cfg)
	const size = 20_000 // 39 sectors and 32 bytes
	for i := range 6 {
		put(t, s, fmt.Sprintf("k%d", i), data(size, i))
	}
	s.flush()
	s.mu.Lock()
	e, _ := s.idx.get(hashKey("k1"))
	s.mu.Unlock()
	direct := s.canReadDirect(e, alignedBytes(size))
	switch {
	case e.hdrLen != sector || e.off%block == 0:
		t.Fatalf("k1's record: %+v, want a staged record off the block grid", e)
	case s.dioAlign <= sector && !direct:
		t.Fatalf("O_DIRECT alignment %d (memory %d), yet k1 is not read directly", s.dioAlign, s.dioMem)
	case s.dioAlign > sector:
		t.Logf("the device's O_DIRECT alignment is %d: staged records go through the window", s.dioAlign)
	}
	for i := range 6 {
		want := data(size, i)
		for _, dst := range [][]byte{alignedBytes(size), alignedBytes(size + 1)[1:]} {
			if err := s.GetObject(bg, fmt.Sprintf("k%d", i), 7, dst); err != nil || string(dst) != string(want) {
				t.Fatalf("get k%d: %v, or wrong bytes", i, err)
			}
		}
		a, b := make([]byte, 7000), make([]byte, size-7000)
		if err := s.GetObject(bg, fmt.Sprintf("k%d", i), 7, a, b); err != nil || string(a)+string(b) != string(want) {
			t.Fatalf("get k%d into runs: %v, or wrong bytes", i, err)
		}
	}
	seg := segmentFiles(t, dir)[0]
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	b[findRecord(t, b, "k1")+sector+5000] ^= 1   // a whole sector of the data
	b[findRecord(t, b, "k2")+sector+size-3] ^= 1 // its partial last sector
	b[findRecord(t, b, "k3")+sector+size-3] ^= 1 // the same, read through the window
	b[findRecord(t, b, "k4")+offFormat] ^= 1     // the header
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"k1", "k2", "k4"} {
		if err := s.GetObject(bg, k, 7, alignedBytes(size)); !errors.Is(err, storage.ErrCorrupt) {
			t.Fatalf("get of damaged %s: %v, want corrupt", k, err)
		}
	}
	if err := s.GetObject(bg, "k3", 7, alignedBytes(size + 1)[1:]); !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("get of damaged k3 through the window: %v, want corrupt", err)
	}
	for _, k := range []string{"k1", "k2", "k3", "k4"} {
		mustMiss(t, s, k, size)
	}
	mustGet(t, s, "k0", data(size, 0))
	if st := s.Stats(); st.CorruptRemoved != 4 {
		t.Fatalf("stats %+v", st)
	}
}

// Where statx overstates what the device takes (an address O_DIRECT
// refuses), a read falls back to the window and still serves the object.
func TestReadDirectRefused(t *testing.T) {
	s := open(t, testConfig(t.TempDir()))
	const size = 20_000
	put(t, s, "k", data(size, 1))
	s.flush()
	s.dioAlign, s.dioMem = sector, 1 // any address, as statx never says
	dst := alignedBytes(size + 1)[1:]
	s.mu.Lock()
	e, _ := s.idx.get(hashKey("k"))
	s.mu.Unlock()
	if !s.canReadDirect(e, dst) {
		t.Fatal("the read does not try O_DIRECT into an odd address")
	}
	if err := s.GetObject(bg, "k", 7, dst); err != nil || string(dst) != string(data(size, 1)) {
		t.Fatalf("get: %v, or wrong bytes", err)
	}
}

// A record that fails its checks is dropped for good: a restart, with hint
// files or without, finds a tombstone for it and reads it as a miss, not as
// corrupt again. (Before, it was dropped in memory only.)
func TestCorruptDropSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.SegmentBytes = 64 << 20
	s := open(t, cfg)
	for i := 0; i < 4; i++ {
		put(t, s, fmt.Sprintf("k%d", i), data(20_000, i))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Two newer segments, so that New does not verify the damaged one's data
	// when it reads it without a hint file.
	for i := 0; i < 2; i++ {
		s = open(t, cfg)
		put(t, s, fmt.Sprintf("n%d", i), data(100, i))
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	seg := segmentFiles(t, dir)[0]
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	b[findRecord(t, b, "k1")+sector+100] ^= 1
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	s = open(t, cfg)
	if _, err := get(s, "k1", 20_000); !errors.Is(err, storage.ErrCorrupt) || !strings.Contains(err.Error(), "dropped") {
		t.Fatalf("get of a damaged record: %v, want corrupt", err)
	}
	if st := s.Stats(); st.CorruptRemoved != 1 || st.CorruptDropped != 1 {
		t.Fatalf("stats %+v", st)
	}
	for _, hints := range []bool{true, false} {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if !hints {
			crash(t, dir)
		}
		s = open(t, cfg)
		mustMiss(t, s, "k1", 20_000)
		for _, i := range []int{0, 2, 3} {
			mustGet(t, s, fmt.Sprintf("k%d", i), data(20_000, i))
		}
		if st := s.Stats(); st.CorruptRemoved != 0 || st.TornTails != 0 {
			t.Fatalf("hints %v: stats after a restart %+v", hints, st)
		}
	}
}
