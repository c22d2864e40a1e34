package redisstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/zeebo/xxh3"

	"github.com/stratakv/strata/storage"
)

func TestCutPlan(t *testing.T) {
	mk := func(ns ...int) [][]byte {
		out := make([][]byte, len(ns))
		for i, n := range ns {
			out[i] = make([]byte, n)
		}
		return out
	}
	const K = 1 << 10
	for _, c := range []struct {
		what  string
		runs  [][]byte
		chunk int64
		want  []int64
	}{
		{"one run, 3.5 chunks", mk(3584 * K), 1024 * K, []int64{1024 * K, 1024 * K, 1024 * K, 512 * K}},
		{"one run under a chunk", mk(100), 4096 * K, []int64{100}},
		{"long runs get their own chunks", mk(128*K, 128*K, 200*K), 4096 * K, []int64{128 * K, 128 * K, 200 * K}},
		{"long runs cut at the chunk size", mk(300*K, 100*K), 256 * K, []int64{256 * K, 44 * K, 100 * K}},
		{"short runs share chunks", mk(2*K, 2*K, 2*K), 4096 * K, []int64{6 * K}},
		{"short runs fill chunks", mk(3*K, 3*K, 3*K), 7 * K, []int64{6 * K, 3 * K}},
		{"short then long then short", mk(K, K, 64*K, K), 4096 * K, []int64{2 * K, 64 * K, K}},
		{"empty runs are skipped", mk(0, 5, 0, 7), 4096 * K, []int64{12}},
		{"small chunk size groups below it", mk(1500, 1500, 500), 1024, []int64{1024, 476, 1024, 476, 500}},
	} {
		got, err := cutPlan(c.runs, c.chunk)
		if err != nil || !samePlan(got, c.want) {
			t.Errorf("%s: cutPlan = %v, %v; want %v", c.what, got, err, c.want)
		}
		if err == nil && sum(got) != runsLen(c.runs) {
			t.Errorf("%s: plan covers %d of %d bytes", c.what, sum(got), runsLen(c.runs))
		}
	}
	if _, err := cutPlan(mk(maxChunks*2), 1); !errors.Is(err, storage.ErrBatch) {
		t.Errorf("a plan of too many chunks: %v, want ErrBatch", err)
	}
}

func sum(plan []int64) int64 {
	var n int64
	for _, v := range plan {
		n += v
	}
	return n
}

func TestMapPlanRoundTrip(t *testing.T) {
	body := randBytes(1, 10000)
	for _, c := range []struct {
		what   string
		runs   [][]byte
		plan   []int64
		direct int
	}{
		{"chunks inside one run", split(body), []int64{4000, 4000, 2000}, 3},
		{"chunks at run boundaries", split(body, 3000, 7000), []int64{3000, 4000, 3000}, 3},
		{"chunks across runs", split(body, 10, 9000, 9001), []int64{5000, 5000}, 0},
		{"a chunk over three runs", split(body, 100, 200, 5000), []int64{10000}, 0},
		{"empty runs", split(body, 0, 0, 5000, 5000), []int64{5000, 5000}, 2},
	} {
		spans := mapPlan(c.runs, c.plan)
		var got []byte
		direct := 0
		for i, sp := range spans {
			if sp.n != c.plan[i] {
				t.Fatalf("%s: span %d of %d bytes, want %d", c.what, i, sp.n, c.plan[i])
			}
			if sp.direct != nil {
				direct++
				if int64(len(sp.direct)) != sp.n || cap(sp.direct) != len(sp.direct) {
					t.Fatalf("%s: direct span %d has len %d cap %d", c.what, i, len(sp.direct), cap(sp.direct))
				}
				got = append(got, sp.direct...)
				continue
			}
			for _, p := range sp.pieces {
				got = append(got, p...)
			}
		}
		if direct != c.direct || !bytes.Equal(got, body) {
			t.Errorf("%s: %d direct spans (want %d), bytes equal %v", c.what, direct, c.direct, bytes.Equal(got, body))
		}
		if sumRuns(c.runs) != xxh3.Hash(body) {
			t.Errorf("%s: streamed checksum differs from the one-shot one", c.what)
		}
	}
}

func TestHeaderRoundTrip(t *testing.T) {
	for _, plan := range [][]int64{{5}, {4 << 20, 4 << 20, 1 << 20}, {100, 200, 100, 100, 7}} {
		h := header{format: 42, bodyLen: sum(plan), bodySum: 7, nameSum: 9, chunkBytes: 4 << 20, plan: plan}
		b := h.encode()
		got, err := decodeHeader(b)
		if err != nil {
			t.Fatalf("plan %v: %v", plan, err)
		}
		if got.format != h.format || got.bodyLen != h.bodyLen || got.bodySum != h.bodySum || got.nameSum != h.nameSum ||
			got.chunkBytes != h.chunkBytes || !samePlan(got.plan, plan) {
			t.Fatalf("plan %v: decoded %+v", plan, got)
		}
		for i := range b {
			bad := bytes.Clone(b)
			bad[i] ^= 0x10
			if _, err := decodeHeader(bad); !errors.Is(err, errHeader) {
				t.Fatalf("plan %v: byte %d flipped: %v", plan, i, err)
			}
		}
		if _, err := decodeHeader(b[:len(b)-1]); !errors.Is(err, errHeader) {
			t.Fatalf("plan %v: truncated header: %v", plan, err)
		}
	}
}

// FuzzDecodeHeader feeds decodeHeader outside input: it never panics, and what it
// accepts is self-consistent. With seal the input's last 8 bytes are set to its
// checksum, so that the fuzzer, which cannot forge a checksum, gets past it to
// the fields and the plan.
func FuzzDecodeHeader(f *testing.F) {
	one := header{format: 1, bodyLen: 10, plan: []int64{10}}.encode()
	three := header{format: 2, bodyLen: 9 << 20, chunkBytes: 4 << 20, plan: []int64{4 << 20, 4 << 20, 1 << 20}}.encode()
	f.Add(one, false)
	f.Add(three, false)
	f.Add(three, true)
	f.Add(three[:len(three)-planEntryBytes], true) // resealed, one entry's bytes short of its plan
	f.Add([]byte("STRATARS"), false)
	f.Fuzz(func(t *testing.T, b []byte, seal bool) {
		if seal && len(b) >= 8 {
			b = bytes.Clone(b) // the fuzzer's input is not ours to change
			end := len(b) - 8
			binary.LittleEndian.PutUint64(b[end:], xxh3.Hash(b[:end]))
		}
		h, err := decodeHeader(b)
		if err != nil {
			if !errors.Is(err, errHeader) {
				t.Fatalf("error outside errHeader: %v", err)
			}
			return
		}
		if len(h.plan) == 0 || len(h.plan) > maxChunks || sum(h.plan) != h.bodyLen {
			t.Fatalf("accepted a header with %d chunks of %d bytes for a body of %d", len(h.plan), sum(h.plan), h.bodyLen)
		}
		h2, err := decodeHeader(h.encode())
		if err != nil || h2.format != h.format || h2.bodyLen != h.bodyLen || h2.bodySum != h.bodySum ||
			h2.nameSum != h.nameSum || h2.chunkBytes != h.chunkBytes || !samePlan(h2.plan, h.plan) {
			t.Fatalf("re-encoded header decodes to %+v, %v; want %+v", h2, err, h)
		}
	})
}

func TestKeys(t *testing.T) {
	if headerKey("a") != "{a}:h" || chunkKey("a", 12) != "{a}:12" {
		t.Fatalf("keys %q %q", headerKey("a"), chunkKey("a", 12))
	}
	// Distinct objects never share a key, whatever their names hold.
	names := []string{"a", "a}", "a}:1", "a}:h", "{a", "a:1", "", "}"}
	seen := map[string]string{}
	for _, n := range names {
		for _, k := range append(chunkKeys(n, 0, 12), headerKey(n)) {
			if other, ok := seen[k]; ok && other != n {
				t.Fatalf("key %q of %q and %q", k, n, other)
			}
			seen[k] = n
		}
	}
}
