package file

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
	"github.com/stratakv/strata/storage/storagetest"
)

const kv = pagekey.TargetPool

// damage rewrites the file at path with edit applied to its bytes.
func damage(t *testing.T, path string, edit func([]byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, edit(b), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCorruptFilesAreMissesAndRemoved(t *testing.T) {
	for _, direct := range []bool{true, false} {
		cases := []struct {
			what string
			part int
			edit func([]byte) []byte
		}{
			{"flipped body byte", 1, func(b []byte) []byte { b[headerSize+100] ^= 0x40; return b }},
			{"flipped last body byte", 0, func(b []byte) []byte { b[len(b)-1] ^= 1; return b }},
			{"flipped header byte", 0, func(b []byte) []byte { b[offBodySum] ^= 1; return b }},
			{"truncated body", 0, func(b []byte) []byte { return b[:headerSize+100] }},
			{"truncated header", 1, func(b []byte) []byte { return b[:100] }},
			{"empty file", 0, func([]byte) []byte { return nil }},
			{"extended file", 0, func(b []byte) []byte { return append(b, 0) }},
			{"zeroed header", 1, func(b []byte) []byte { clear(b[:headerSize]); return b }},
		}
		for _, c := range cases {
			t.Run(c.what, func(t *testing.T) {
				cfg := testConfig(t.TempDir(), nil)
				cfg.DirectIO = direct
				f := newFixture(t, cfg, mhaPools)
				f.put(kv, 0, 1, 2)
				path := f.file(kv, 1, c.part)
				damage(t, path, c.edit)
				errs := f.get(kv, 0, 1, 2)
				if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], storage.ErrCorrupt) {
					t.Fatalf("get = %v; want nil, ErrCorrupt, nil", errs)
				}
				if exists(path) {
					t.Fatal("corrupt file still there")
				}
				if st := f.s.Stats(); st.CorruptRemoved != 1 || st.Faults["corrupt"] != 1 {
					t.Fatalf("stats: %d corrupt removed, %d corrupt faults; want 1, 1", st.CorruptRemoved, st.Faults["corrupt"])
				}
				expectErr(t, "second get", f.get(kv, 1)[0], storage.ErrNotFound)
				if n := f.exists(kv, 0, 1, 2); n != 1 {
					t.Fatalf("Exists = %d, want 1", n)
				}
				// A new put repairs the key.
				f.put(kv, 1)
				if errs := f.get(kv, 1); errs[0] != nil {
					t.Fatal(errs[0])
				}
			})
		}
	}
}

func TestExistsRemovesCorruptHeaders(t *testing.T) {
	f := newFixture(t, testConfig(t.TempDir(), nil), mhaPools)
	f.put(kv, 0, 1)
	path := f.file(kv, 0, 1)
	damage(t, path, func(b []byte) []byte { b[5] ^= 1; return b })
	if n := f.exists(kv, 0, 1); n != 0 {
		t.Fatalf("Exists = %d, want 0", n)
	}
	if exists(path) {
		t.Fatal("corrupt file still there")
	}
	// A file of the right header but the wrong length is corrupt too, and a put
	// replaces a corrupt file.
	path = f.file(kv, 1, 0)
	damage(t, path, func(b []byte) []byte { return b[:len(b)-1] })
	f.put(kv, 1)
	if errs := f.get(kv, 1); errs[0] != nil {
		t.Fatal(errs[0])
	}
}

func TestMisplacedFileIsCorrupt(t *testing.T) {
	f := newFixture(t, testConfig(t.TempDir(), nil), mhaPools)
	f.put(kv, 0, 1)
	// Key 0's K file copied over key 1's: sound header, same format, another name.
	b, err := os.ReadFile(f.file(kv, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.file(kv, 1, 0), b, 0o644); err != nil {
		t.Fatal(err)
	}
	expectErr(t, "get of a misplaced file", f.get(kv, 1)[0], storage.ErrCorrupt)
}

func TestOtherFormatIsAMissAndStays(t *testing.T) {
	f := newFixture(t, testConfig(t.TempDir(), nil), mhaPools)
	f.put(kv, 0, 1)
	path := f.file(kv, 1, 0)
	damage(t, path, func(b []byte) []byte {
		h, err := decodeHeader(b)
		if err != nil {
			t.Fatal(err)
		}
		h.format++
		h.encode(b)
		return b
	})
	before, _ := os.ReadFile(path)
	errs := f.get(kv, 0, 1)
	if errs[0] != nil || !errors.Is(errs[1], storage.ErrNotFound) {
		t.Fatalf("get = %v; want nil, ErrNotFound", errs)
	}
	if n := f.exists(kv, 0, 1); n != 1 {
		t.Fatalf("Exists = %d, want 1", n)
	}
	// A put does not clobber it (write-once, whatever the format).
	f.put(kv, 1)
	after, err := os.ReadFile(path)
	if err != nil || string(before) != string(after) {
		t.Fatalf("the other format's file changed or went: %v", err)
	}
	if st := f.s.Stats(); st.FormatConflicts != 1 || st.CorruptRemoved != 0 {
		t.Fatalf("stats: %d format conflicts, %d corrupt removed; want 1, 0", st.FormatConflicts, st.CorruptRemoved)
	}
	// Another format with another length: a miss as well.
	damage(t, path, func(b []byte) []byte {
		h, _ := decodeHeader(b)
		h.bodyLen += 4096
		h.encode(b)
		return append(b, make([]byte, 4096)...)
	})
	expectErr(t, "get of another format of another length", f.get(kv, 1)[0], storage.ErrNotFound)
	if !exists(path) {
		t.Fatal("another format's file was removed")
	}
}

func TestCapacitySmallerThanAnObject(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, nil)
	// Room for two small objects (two 8 KiB parts each), not for one 36 KiB part file.
	cfg.CapacityBytes = 32 << 10
	f := newFixture(t, cfg, []pool.PoolSpec{
		{Name: kv, Geometry: storagetest.TargetGeometry},
		{Name: "big", Geometry: bigGeometry},
	})
	for i, err := range f.s.Put(bg, "big", f.pick([]int{0, 1}), pages([]int{0, 1})) {
		if !errors.Is(err, storage.ErrNoSpace) || !strings.Contains(err.Error(), "CapacityBytes") {
			t.Fatalf("put of an object larger than the capacity, key %d: %v; want ErrNoSpace saying what to raise", i, err)
		}
	}
	// What fits is still served.
	f.put(kv, 0, 1)
	if errs := f.get(kv, 0, 1); errs[0] != nil || errs[1] != nil {
		t.Fatalf("get = %v", errs)
	}
	objects, temps := walk(t, dir)
	if len(objects) != 4 || len(temps) != 0 {
		t.Fatalf("directory holds %d objects and %d temporary files; want 4 and 0", len(objects), len(temps))
	}
	if st := f.s.Stats(); st.Faults["no_space"] != 2 || st.Bytes != 32<<10 {
		t.Fatalf("stats: %d no_space faults, %d bytes; want 2, %d", st.Faults["no_space"], st.Bytes, 32<<10)
	}
}

// A real full filesystem: a 1 MiB tmpfs under the default 64 GiB capacity. The
// store's capacity follows the device's free space, so puts evict the least
// recently used objects instead of failing: before, every put past the first
// megabyte failed with ErrNoSpace and nothing was ever evicted (the node
// service's spill dropped every evicted object, logging each).
func TestFullFilesystem(t *testing.T) {
	dir := t.TempDir()
	mount(t, "tmpfs", dir, "tmpfs", 0, "size=1m")
	f := newFixture(t, testConfig(dir, nil), []pool.PoolSpec{{Name: "big", Geometry: bigGeometry}})
	// 16 objects of two 36 KiB files do not fit in 1 MiB together: put them one
	// batch of two at a time, so that recency is the order of the batches.
	for i := 0; i < 16; i += 2 {
		idx := []int{i, i + 1}
		for j, err := range f.s.Put(bg, "big", f.pick(idx), pages(idx)) {
			if err != nil {
				t.Fatalf("put of key %d on a full device: %v; want older objects evicted", idx[j], err)
			}
		}
	}
	if _, temps := walk(t, dir); len(temps) != 0 {
		t.Fatalf("temporary files left behind: %v", temps)
	}
	st := f.s.Stats()
	if st.Evictions == 0 || st.Faults["no_space"] != 0 {
		t.Fatalf("%d evictions, %d no_space faults; want evictions and no faults", st.Evictions, st.Faults["no_space"])
	}
	// The newest objects are served; evicted ones are misses, never corrupt.
	errs := f.get("big", 14, 15)
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("the newest objects: %v", errs)
	}
	for i, err := range f.get("big", 0, 1, 2, 3) {
		if err != nil && !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("old key %d: %v; want served or not found", i, err)
		}
	}
}

// A device that fills up behind the index's back (another user of the disk
// between the free-space check and the write) answers ENOSPC: the store evicts
// its own least recently used objects and writes again.
func TestENOSPCEvictsAndRetries(t *testing.T) {
	dir := t.TempDir()
	mount(t, "tmpfs", dir, "tmpfs", 0, "size=256k")
	s := newStore(t, testConfig(dir, nil))
	s.freeBytes = func() int64 { return math.MaxInt64 } // the index never sees the device fill
	body := make([]byte, 40<<10)
	for i := range 20 { // 800 KiB through a 256 KiB device
		body[0] = byte(i)
		if err := s.PutObject(bg, fmt.Sprintf("obj-%d", i), 1, body); err != nil {
			t.Fatalf("put %d: %v; want the oldest objects evicted on ENOSPC", i, err)
		}
	}
	got := make([]byte, len(body))
	if err := s.GetObject(bg, "obj-19", 1, got); err != nil || got[0] != 19 {
		t.Fatalf("the newest object: %v", err)
	}
	if st := s.Stats(); st.Evictions == 0 {
		t.Fatal("no evictions")
	}
}

// An object larger than the whole device is refused with ErrNoSpace, after
// evicting what could be evicted: nothing else can make it fit.
func TestObjectLargerThanTheDevice(t *testing.T) {
	dir := t.TempDir()
	mount(t, "tmpfs", dir, "tmpfs", 0, "size=64k")
	s := newStore(t, testConfig(dir, nil))
	if err := s.PutObject(bg, "small", 1, make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	if err := s.PutObject(bg, "huge", 1, make([]byte, 1<<20)); !errors.Is(err, storage.ErrNoSpace) {
		t.Fatalf("an object larger than the device: %v", err)
	}
	if err := s.PutObject(bg, "small-again", 1, make([]byte, 4096)); err != nil {
		t.Fatalf("a small put after the refusal: %v", err)
	}
}

// A read-only directory: New works, registration says what is wrong, reads work,
// puts are refused.
func TestReadOnlyDirectory(t *testing.T) {
	src := t.TempDir()
	w := newFixture(t, testConfig(src, nil), mhaPools)
	w.put(kv, 0, 1)

	dst := t.TempDir()
	mount(t, src, dst, "", unix.MS_BIND, "")
	if err := unix.Mount("", dst, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		skipOrFail(t, "cannot remount a bind mount read-only: "+err.Error())
	}
	if _, err := New(testConfig(filepath.Join(dst, "missing", "dir"), nil)); !errors.Is(err, storage.ErrConfig) {
		t.Fatalf("New in a directory that cannot be created: %v, want ErrConfig", err)
	}
	s := newStore(t, testConfig(dst, nil))
	g := storagetest.NewGroup(t, s, kvlayout.PageFirst, storagetest.PageSize, mhaPools)
	err := s.RegisterPool(bg, g.Spec(kv))
	if !errors.Is(err, storage.ErrRegistration) || !strings.Contains(err.Error(), "not writable") {
		t.Fatalf("RegisterPool on a read-only directory: %v; want ErrRegistration saying it is not writable", err)
	}
	t.Logf("registration error: %v", err)
	keys := w.keys[:3]
	if n, err := s.Exists(bg, kv, keys); n != 2 || err != nil {
		t.Fatalf("Exists = %d, %v; want 2", n, err)
	}
	for i, err := range s.Get(bg, kv, keys[:2], pages([]int{40, 41})) {
		if err != nil {
			t.Fatalf("get from a read-only store: %v", err)
		}
		if err := storagetest.Check(g.Spec(kv), pool.PageID(40+i), i, 0); err != nil {
			t.Fatal(err)
		}
	}
	storagetest.Fill(g.Spec(kv), 2, 2, 0)
	for _, err := range s.Put(bg, kv, keys[2:], pages([]int{2})) {
		expectErr(t, "put to a read-only store", err, storage.ErrNotRegistered)
	}
}

func TestDirectIOFallsBackOnRamfs(t *testing.T) {
	dir := t.TempDir()
	mount(t, "ramfs", dir, "ramfs", 0, "")
	logs := &logBuffer{}
	f := newFixture(t, testConfig(dir, logs), mhaPools)
	f.put(kv, 0, 1, 2)
	f.put(pagekey.DraftPool, 0, 1, 2)
	for _, p := range []string{kv, pagekey.DraftPool} {
		for i, err := range f.get(p, 0, 1, 2) {
			if err != nil {
				t.Fatalf("get %s %d: %v", p, i, err)
			}
		}
	}
	if n := strings.Count(logs.String(), "refuses O_DIRECT"); n != 1 {
		t.Fatalf("%d fallback log lines, want 1:\n%s", n, logs)
	}
	if f.s.Stats().DirectIO {
		t.Fatal("stats still report direct I/O")
	}
	if _, temps := walk(t, dir); len(temps) != 0 {
		t.Fatalf("temporary files left behind: %v", temps)
	}
}

func TestConformanceRamfsFallback(t *testing.T) {
	root := t.TempDir()
	mount(t, "ramfs", root, "ramfs", 0, "")
	conformance(t, root, nil)
}

func TestBadConfigAndNames(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for what, cfg := range map[string]Config{
		"no directory":       {CapacityBytes: 1 << 20},
		"zero capacity":      {Dir: dir},
		"negative workers":   {Dir: dir, CapacityBytes: 1 << 20, IOWorkers: -1},
		"too many workers":   {Dir: dir, CapacityBytes: 1 << 20, IOWorkers: 1000},
		"a file, not a dir":  {Dir: notDir, CapacityBytes: 1 << 20},
		"under a file":       {Dir: filepath.Join(notDir, "sub"), CapacityBytes: 1 << 20},
		"negative capacity":  {Dir: dir, CapacityBytes: -1},
		"capacity and zeros": {Dir: "", CapacityBytes: 0},
	} {
		if _, err := New(cfg); !errors.Is(err, storage.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", what, err)
		}
	}
	s := newStore(t, testConfig(dir, nil))
	g := storagetest.NewGroup(t, s, kvlayout.PageFirst, storagetest.PageSize, mhaPools)
	for _, prefix := range []string{"a/b", "../up", ".hidden", "sp ace", "nul\x00", strings.Repeat("m", 200), "ünï"} {
		spec := g.Spec(kv)
		spec.Names.ModelPrefix = prefix
		if err := s.RegisterPool(bg, spec); !errors.Is(err, storage.ErrConfig) {
			t.Errorf("model prefix %q: %v, want ErrConfig", prefix, err)
		}
	}
	spec := g.Spec(kv)
	spec.Names.ModelPrefix = "Org.Model-7B:v1_2"
	if err := s.RegisterPool(bg, spec); err != nil {
		t.Fatalf("a model prefix of allowed characters: %v", err)
	}
}
