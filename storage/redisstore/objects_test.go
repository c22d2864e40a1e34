package redisstore

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stratakv/strata/internal/redistest"
	"github.com/stratakv/strata/storage"
)

// chunkFixture is a store with 64 KiB chunks over a fresh server.
func chunkFixture(t *testing.T) (*Store, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	cfg := testConfig(t, srv.Addr())
	cfg.ChunkBytes = 64 << 10
	return newStore(t, cfg), srv
}

const chunk = 64 << 10

// body35 is an object of 3.5 chunks.
func body35(seed uint64) []byte { return randBytes(seed, 3*chunk+chunk/2) }

func TestObjectAPI(t *testing.T) {
	s, srv := chunkFixture(t)
	body := body35(1)
	if err := s.PutObject(bg, "obj:1_0_k", 42, body); err != nil {
		t.Fatal(err)
	}
	if n := keyCount(t, srv); n != "5" {
		t.Fatalf("an object of 3.5 chunks is %s keys, want a header and 4 chunks", n)
	}
	if n, err := s.ObjectSize(bg, "obj:1_0_k", 42); err != nil || n != int64(len(body)) {
		t.Fatalf("ObjectSize = %d, %v", n, err)
	}
	if _, err := s.ObjectSize(bg, "obj:1_0_k", 43); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("size in another format: %v", err)
	}
	got := make([]byte, len(body))
	if err := s.GetObject(bg, "obj:1_0_k", 42, got); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("get: %v, equal %v", err, bytes.Equal(got, body))
	}
	if st := s.Stats(); st.Replans != 0 || st.Staged != 0 {
		t.Fatalf("a read with the writer's cut was replanned or staged: %+v", st)
	}
	// Read into differently split runs: the writer's cut is followed, chunks that
	// cross runs are staged.
	clear(got)
	if err := s.GetObject(bg, "obj:1_0_k", 42, split(got, 3, chunk+7, 2*chunk+100)...); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("get into other runs: %v, equal %v", err, bytes.Equal(got, body))
	}
	if st := s.Stats(); st.Replans != 1 || st.Staged == 0 {
		t.Fatalf("read with another cut: %d replans, %d staged chunks", st.Replans, st.Staged)
	}
	// Write-once, even for a put of another length.
	if err := s.PutObject(bg, "obj:1_0_k", 42, body[:100]); err != nil {
		t.Fatalf("second put: %v", err)
	}
	if err := s.GetObject(bg, "obj:1_0_k", 42, got); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("object changed by a second put: %v", err)
	}
	if err := s.GetObject(bg, "obj:1_0_k", 42, got[:10]); !errors.Is(err, storage.ErrBatch) {
		t.Fatalf("get with the wrong length: %v", err)
	}
	if err := s.GetObject(bg, "obj:missing", 42, got); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("missing object: %v", err)
	}
	if err := s.PutObject(bg, "empty", 1); !errors.Is(err, storage.ErrBatch) {
		t.Fatalf("empty put: %v", err)
	}
	if err := s.PutObject(bg, "", 1, body); !errors.Is(err, storage.ErrBatch) {
		t.Fatalf("unnamed put: %v", err)
	}
	// Any bytes make a name.
	odd := "a}b{c d\x00\xff:h"
	if err := s.PutObject(bg, odd, 1, body[:5000]); err != nil {
		t.Fatal(err)
	}
	if err := s.GetObject(bg, odd, 1, got[:5000]); err != nil || !bytes.Equal(got[:5000], body[:5000]) {
		t.Fatalf("odd name: %v", err)
	}
	if existed, err := s.RemoveObject(bg, "obj:1_0_k"); err != nil || !existed {
		t.Fatalf("remove: %v, %v", existed, err)
	}
	if existed, err := s.RemoveObject(bg, "obj:1_0_k"); err != nil || existed {
		t.Fatalf("second remove: %v, %v", existed, err)
	}
	if _, err := s.ObjectSize(bg, "obj:1_0_k", 42); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("removed object: %v", err)
	}
	if n := keyCount(t, srv); n != "2" {
		t.Fatalf("%s keys left, want the odd object's 2", n)
	}
}

func TestObjectBatches(t *testing.T) {
	s, _ := chunkFixture(t)
	var objs []Object
	bodies := map[string][]byte{}
	for i := range 10 {
		name := "batch-" + strconv.Itoa(i)
		bodies[name] = randBytes(uint64(i), 1000+i*30000)
		if i%3 != 2 {
			objs = append(objs, Object{Name: name, Format: 5, Runs: [][]byte{bodies[name]}})
		}
	}
	for i, err := range s.PutObjects(bg, objs) {
		if err != nil {
			t.Fatalf("put %s: %v", objs[i].Name, err)
		}
	}
	names := make([]string, 10)
	var gets []Object
	for i := range names {
		names[i] = "batch-" + strconv.Itoa(i)
		gets = append(gets, Object{Name: names[i], Format: 5, Runs: [][]byte{make([]byte, len(bodies[names[i]]))}})
	}
	if n, err := s.ExistsObjects(bg, names, 5); n != 2 || err != nil {
		t.Fatalf("ExistsObjects = %d, %v; want 2", n, err)
	}
	if n, err := s.ExistsObjects(bg, names[:2], 6); n != 0 || err != nil {
		t.Fatalf("ExistsObjects in another format = %d, %v; want 0", n, err)
	}
	for i, err := range s.GetObjects(bg, gets) {
		switch {
		case i%3 == 2 && !errors.Is(err, storage.ErrNotFound):
			t.Fatalf("get of unstored %s: %v", names[i], err)
		case i%3 != 2 && err != nil:
			t.Fatalf("get %s: %v", names[i], err)
		case i%3 != 2 && !bytes.Equal(gets[i].Runs[0], bodies[names[i]]):
			t.Fatalf("get %s: wrong bytes", names[i])
		}
	}
}

func TestTTL(t *testing.T) {
	srv := redistest.Start(t)
	cfg := testConfig(t, srv.Addr())
	cfg.ChunkBytes = chunk
	cfg.TTL = time.Minute
	s := newStore(t, cfg)
	if err := s.PutObject(bg, "ttl", 1, body35(3)); err != nil {
		t.Fatal(err)
	}
	for _, k := range append(chunkKeys("ttl", 0, 4), headerKey("ttl")) {
		ms, err := strconv.Atoi(do(t, srv, "PTTL", k))
		if err != nil || ms <= 0 || ms > 60000 {
			t.Fatalf("PTTL %s = %d, %v; want (0, 60000]", k, ms, err)
		}
	}
}

// TestChunkDamage damages an object's keys by hand, one way at a time.
func TestChunkDamage(t *testing.T) {
	s, srv := chunkFixture(t)
	body := body35(2)
	got := make([]byte, len(body))
	put := func(name string) {
		t.Helper()
		if err := s.PutObject(bg, name, 7, body); err != nil {
			t.Fatal(err)
		}
	}
	gone := func(name string) {
		t.Helper()
		if n := do(t, srv, "EXISTS", headerKey(name), chunkKey(name, 0), chunkKey(name, 1), chunkKey(name, 2), chunkKey(name, 3)); n != "0" {
			t.Fatalf("%s: %s keys left after it was found damaged", name, n)
		}
	}
	for _, c := range []struct {
		what   string
		damage func(name string)
		want   error
	}{
		{"chunk deleted", func(name string) { do(t, srv, "DEL", chunkKey(name, 2)) }, storage.ErrNotFound},
		{"chunk truncated", func(name string) { do(t, srv, "SET", chunkKey(name, 1), "short") }, storage.ErrCorrupt},
		{"last chunk emptied", func(name string) { do(t, srv, "SET", chunkKey(name, 3), "") }, storage.ErrNotFound},
		{"byte flipped", func(name string) {
			b := []byte(do(t, srv, "GETRANGE", chunkKey(name, 0), "100", "100"))
			do(t, srv, "SETRANGE", chunkKey(name, 0), "100", string([]byte{b[0] ^ 0x40}))
		}, storage.ErrCorrupt},
		{"header byte flipped", func(name string) {
			b := []byte(do(t, srv, "GETRANGE", headerKey(name), "20", "20"))
			do(t, srv, "SETRANGE", headerKey(name), "20", string([]byte{b[0] ^ 1}))
		}, storage.ErrCorrupt},
		{"header of another object", func(name string) {
			other := name + "-other"
			put(other)
			do(t, srv, "SET", headerKey(name), do(t, srv, "GET", headerKey(other)))
		}, storage.ErrCorrupt},
	} {
		name := "damage-" + c.what
		put(name)
		c.damage(name)
		if err := s.GetObject(bg, name, 7, got); !errors.Is(err, c.want) {
			t.Fatalf("%s: get: %v, want %v", c.what, err, c.want)
		}
		gone(name)
		// The next put stores it again.
		put(name)
		if err := s.GetObject(bg, name, 7, got); err != nil || !bytes.Equal(got, body) {
			t.Fatalf("%s: get after a new put: %v", c.what, err)
		}
	}
	// A chunk made longer: the bytes past its length are not the object's and are
	// not read; the object is served as its header describes it.
	put("longer")
	do(t, srv, "APPEND", chunkKey("longer", 1), "tail")
	if err := s.GetObject(bg, "longer", 7, got); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("chunk with a tail: %v", err)
	}
	// A chunk from another object of the same length: the checksum catches it.
	put("twin")
	other := randBytes(9, len(body))
	if err := s.PutObject(bg, "twin-src", 7, other); err != nil {
		t.Fatal(err)
	}
	do(t, srv, "SET", chunkKey("twin", 2), do(t, srv, "GET", chunkKey("twin-src", 2)))
	if err := s.GetObject(bg, "twin", 7, got); !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("chunk of another object: %v", err)
	}
	// A header of another format: a miss, left alone, and never replaced.
	put("fmt")
	if err := s.GetObject(bg, "fmt", 8, got); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("another format: %v", err)
	}
	if err := s.PutObject(bg, "fmt", 8, other); err != nil {
		t.Fatalf("put in another format: %v", err)
	}
	if err := s.GetObject(bg, "fmt", 7, got); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("object of the first format after another format's get and put: %v", err)
	}
	if st := s.Stats(); st.FormatConflicts != 1 || st.CorruptRemoved < 5 || st.Partial < 2 {
		t.Fatalf("stats: %+v", st)
	}
	// A Redis that answers an error (a chunk key someone overwrote with a list:
	// WRONGTYPE): the object is not served, the error says what Redis said, and
	// the other objects of the batch are served.
	put("wrongtype")
	do(t, srv, "DEL", chunkKey("wrongtype", 1))
	do(t, srv, "RPUSH", chunkKey("wrongtype", 1), "x")
	put("neighbour")
	got2 := make([]byte, len(body))
	errs := s.GetObjects(bg, []Object{{Name: "wrongtype", Format: 7, Runs: [][]byte{got}}, {Name: "neighbour", Format: 7, Runs: [][]byte{got2}}})
	if !errors.Is(errs[0], storage.ErrIO) || !strings.Contains(errs[0].Error(), "WRONGTYPE") {
		t.Fatalf("chunk of the wrong type: %v", errs[0])
	}
	if errs[1] != nil || !bytes.Equal(got2, body) {
		t.Fatalf("the other object of the batch: %v", errs[1])
	}
	// Damage found by Exists is removed too.
	put("exists")
	do(t, srv, "DEL", chunkKey("exists", 3))
	if n, err := s.ExistsObjects(bg, []string{"exists"}, 7); n != 0 || err != nil {
		t.Fatalf("ExistsObjects of a partial object = %d, %v", n, err)
	}
	gone("exists")
}

// TestEviction fills a server far past its maxmemory under allkeys-lru: every
// read is the exact bytes or a miss, never wrong bytes.
func TestEviction(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru", "--maxmemory-samples", "3")
	cfg := testConfig(t, srv.Addr())
	cfg.ChunkBytes = 16 << 10
	s := newStore(t, cfg)
	const objects, size = 240, 40 << 10 // 9.6 MB into 4 MB
	body := func(i int) []byte { return randBytes(uint64(i)+100, size) }
	for first := 0; first < objects; first += 24 {
		var objs []Object
		for i := first; i < first+24; i++ {
			objs = append(objs, Object{Name: fmt.Sprintf("evict-%d", i), Format: 3, Runs: [][]byte{body(i)}})
		}
		for i, err := range s.PutObjects(bg, objs) {
			if err != nil {
				t.Fatalf("put %s: %v", objs[i].Name, err)
			}
		}
	}
	hits, misses := 0, 0
	for first := 0; first < objects; first += 24 {
		var objs []Object
		for i := first; i < first+24; i++ {
			objs = append(objs, Object{Name: fmt.Sprintf("evict-%d", i), Format: 3, Runs: [][]byte{make([]byte, size)}})
		}
		for j, err := range s.GetObjects(bg, objs) {
			switch {
			case err == nil:
				if !bytes.Equal(objs[j].Runs[0], body(first+j)) {
					t.Fatalf("%s: a get succeeded with wrong bytes", objs[j].Name)
				}
				hits++
			case errors.Is(err, storage.ErrNotFound):
				misses++
			default:
				t.Fatalf("get %s: %v", objs[j].Name, err)
			}
		}
	}
	st := s.Stats()
	t.Logf("%d hits, %d misses (%d partial objects removed)", hits, misses, st.Partial)
	if hits == 0 || misses == 0 {
		t.Fatalf("%d hits and %d misses: the test did not evict", hits, misses)
	}
}

// TestNoEviction runs against a full server that refuses writes: puts fail with
// ErrNoSpace, what was stored still reads back. (2 MB rather than 1: an empty
// redis-server 7.0 already uses about 0.9 MB, so at 1 MB nothing fits.)
func TestNoEviction(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction")
	cfg := testConfig(t, srv.Addr())
	cfg.ChunkBytes = 16 << 10
	s := newStore(t, cfg)
	const size = 40 << 10
	stored := 0
	var full error
	for i := 0; i < 200 && full == nil; i++ {
		full = s.PutObject(bg, fmt.Sprintf("full-%d", i), 3, randBytes(uint64(i), size))
		if full == nil {
			stored++
		}
	}
	if !errors.Is(full, storage.ErrNoSpace) {
		t.Fatalf("after %d objects: %v, want ErrNoSpace", stored, full)
	}
	if stored == 0 {
		t.Fatal("nothing could be stored before the server filled up")
	}
	t.Logf("%d objects stored, then: %v", stored, full)
	got := make([]byte, size)
	for i := 0; i < stored; i++ {
		if err := s.GetObject(bg, fmt.Sprintf("full-%d", i), 3, got); err != nil || !bytes.Equal(got, randBytes(uint64(i), size)) {
			t.Fatalf("get full-%d from a full server: %v", i, err)
		}
	}
	// The put that failed left nothing behind that reads as the object.
	if err := s.GetObject(bg, fmt.Sprintf("full-%d", stored), 3, got); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("get of the refused object: %v", err)
	}
	if st := s.Stats(); st.Faults["no_space"] == 0 || st.Shards[0].Failures != 0 {
		t.Fatalf("stats: %+v", st)
	}
}
