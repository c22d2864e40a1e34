package storage_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// scriptedBackend answers every call with what the test set, and records the calls
// so the test can see they went through the wrapper.
type scriptedBackend struct {
	name string

	mu        sync.Mutex
	calls     []string
	regErr    error
	existsN   int
	existsErr error
	results   []error // per-key results of the next Get or Put
	closeErr  error
}

func (s *scriptedBackend) Name() string            { return s.name }
func (s *scriptedBackend) Allocator() hostmem.Kind { return hostmem.Shm }

func (s *scriptedBackend) record(c string) {
	s.mu.Lock()
	s.calls = append(s.calls, c)
	s.mu.Unlock()
}

func (s *scriptedBackend) RegisterPool(_ context.Context, spec storage.PoolSpec) error {
	s.record("register " + spec.Name)
	return s.regErr
}

func (s *scriptedBackend) Exists(_ context.Context, pool string, keys []pagekey.Key) (int, error) {
	s.record(fmt.Sprintf("exists %s %d", pool, len(keys)))
	return s.existsN, s.existsErr
}

func (s *scriptedBackend) batch(op, pool string, keys []pagekey.Key) []error {
	s.record(fmt.Sprintf("%s %s %d", op, pool, len(keys)))
	if s.results == nil {
		return make([]error, len(keys))
	}
	return s.results
}

func (s *scriptedBackend) Get(_ context.Context, pool string, keys []pagekey.Key, _ []pool.PageID) []error {
	return s.batch("get", pool, keys)
}

func (s *scriptedBackend) Put(_ context.Context, pool string, keys []pagekey.Key, _ []pool.PageID) []error {
	return s.batch("put", pool, keys)
}

func (s *scriptedBackend) Close() error {
	s.record("close")
	return s.closeErr
}

func testKeys(t *testing.T, n int) []pagekey.Key {
	t.Helper()
	h, err := pagekey.New(pagekey.Config{PageSize: 1, Algorithm: pagekey.XXH3})
	if err != nil {
		t.Fatal(err)
	}
	toks := make([]uint32, n)
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	return h.Keys(pagekey.Key{}, toks)
}

// metricValue finds the sample of name whose labels include want, in a fresh gather.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					continue metrics
				}
			}
			return sampleValue(mf.GetType(), m), true
		}
	}
	return 0, false
}

func sampleValue(typ dto.MetricType, m *dto.Metric) float64 {
	switch typ {
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue()
	case dto.MetricType_HISTOGRAM:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return m.GetGauge().GetValue()
}

func TestInstrumentCountsCallsKeysBytesAndFaults(t *testing.T) {
	ctx := context.Background()
	fake := &scriptedBackend{name: "fake"}
	reg := prometheus.NewRegistry()
	b, err := storage.Instrument(fake, reg)
	if err != nil {
		t.Fatal(err)
	}
	if b.Name() != "fake" || b.Allocator() != hostmem.Shm {
		t.Fatalf("wrapper name %q allocator %q, want the backend's", b.Name(), b.Allocator())
	}

	// A real pool, so that the wrapper sees a real layout: 2 parts of
	// 4 tokens × 2 layers × 2 heads × 8 dim × 2 bytes = 256 bytes each.
	alloc, err := hostmem.New(hostmem.Config{Kind: hostmem.Mmap, Available: func() (int64, error) { return 1 << 40, nil }})
	if err != nil {
		t.Fatal(err)
	}
	g, err := pool.BuildGroup(pool.GroupSpec{
		Pools:    []pool.PoolSpec{{Name: "kv", Geometry: kvlayout.Geometry{Layers: 2, KVHeads: 2, HeadDim: 8, DTypeBytes: 2}}},
		Layout:   kvlayout.PageFirst,
		PageSize: 4,
		Pages:    8,
	}, alloc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	const pageBytes = 2 * 256
	if err := b.RegisterPool(ctx, storage.SpecOf(g.Target(), pagekey.Names{})); err != nil {
		t.Fatal(err)
	}
	fake.regErr = fmt.Errorf("segment outside: %w", storage.ErrRegistration)
	if err := b.RegisterPool(ctx, storage.PoolSpec{Name: "draft"}); !errors.Is(err, storage.ErrRegistration) {
		t.Fatalf("failed registration returned %v, want the backend's error unchanged", err)
	}

	keys := testKeys(t, 4)
	pages := []pool.PageID{0, 1, 2, 3}
	// Put: all ok.
	for _, e := range b.Put(ctx, "kv", keys, pages) {
		if e != nil {
			t.Fatal(e)
		}
	}
	// Get: 2 ok, 1 miss, 1 timeout -> partial.
	fake.results = []error{nil, storage.ErrNotFound, nil, fmt.Errorf("slow: %w", storage.ErrTimeout)}
	if got := b.Get(ctx, "kv", keys, pages); !errors.Is(got[3], storage.ErrTimeout) || got[0] != nil {
		t.Fatalf("get results not passed through: %v", got)
	}
	// Get: misses only -> miss.
	fake.results = []error{storage.ErrNotFound, storage.ErrNotFound, storage.ErrNotFound, storage.ErrNotFound}
	b.Get(ctx, "kv", keys, pages)
	// Put: every key faulted -> error.
	fake.results = storage.FailAll(4, fmt.Errorf("disk: %w", storage.ErrNoSpace))
	b.Put(ctx, "kv", keys, pages)
	// Exists: 3 of 4, then a call-level failure.
	fake.existsN = 3
	if n, err := b.Exists(ctx, "kv", keys); n != 3 || err != nil {
		t.Fatalf("exists = %d, %v", n, err)
	}
	fake.existsErr = fmt.Errorf("conn: %w", storage.ErrUnavailable)
	if _, err := b.Exists(ctx, "kv", keys); !errors.Is(err, storage.ErrUnavailable) {
		t.Fatalf("exists error = %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	type sample struct {
		name   string
		labels map[string]string
		want   float64
	}
	for _, s := range []sample{
		{"strata_l3_ops_total", map[string]string{"backend": "fake", "op": "register", "result": "ok"}, 1},
		{"strata_l3_ops_total", map[string]string{"op": "register", "result": "error"}, 1},
		{"strata_l3_ops_total", map[string]string{"op": "put", "result": "ok"}, 1},
		{"strata_l3_ops_total", map[string]string{"op": "put", "result": "error"}, 1},
		{"strata_l3_ops_total", map[string]string{"op": "get", "result": "partial"}, 1},
		{"strata_l3_ops_total", map[string]string{"op": "get", "result": "miss"}, 1},
		{"strata_l3_ops_total", map[string]string{"op": "exists", "result": "ok"}, 1},
		{"strata_l3_ops_total", map[string]string{"op": "exists", "result": "error"}, 1},
		{"strata_l3_ops_total", map[string]string{"op": "close", "result": "ok"}, 1},
		{"strata_l3_op_duration_seconds", map[string]string{"op": "get"}, 2},
		{"strata_l3_op_duration_seconds", map[string]string{"op": "put"}, 2},
		{"strata_l3_op_duration_seconds", map[string]string{"op": "register"}, 2},
		{"strata_l3_bytes_total", map[string]string{"backend": "fake", "op": "put"}, 4 * pageBytes},
		{"strata_l3_bytes_total", map[string]string{"op": "get"}, 2 * pageBytes},
		{"strata_l3_keys_total", map[string]string{"op": "get", "result": "ok"}, 2},
		{"strata_l3_keys_total", map[string]string{"op": "get", "result": "miss"}, 5},
		{"strata_l3_keys_total", map[string]string{"op": "get", "result": "fault"}, 1},
		{"strata_l3_keys_total", map[string]string{"op": "put", "result": "fault"}, 4},
		{"strata_l3_keys_total", map[string]string{"op": "exists", "result": "ok"}, 3},
		{"strata_l3_keys_total", map[string]string{"op": "exists", "result": "miss"}, 1},
		{"strata_l3_faults_total", map[string]string{"backend": "fake", "kind": "timeout"}, 1},
		{"strata_l3_faults_total", map[string]string{"kind": "no_space"}, 4},
		{"strata_l3_faults_total", map[string]string{"kind": "unavailable"}, 1},
		{"strata_l3_faults_total", map[string]string{"kind": "not_registered"}, 1},
	} {
		got, ok := metricValue(t, reg, s.name, s.labels)
		if !ok || got != s.want {
			t.Errorf("%s%v = %v (found %v), want %v", s.name, s.labels, got, ok, s.want)
		}
	}
	// Misses are not faults.
	if _, ok := metricValue(t, reg, "strata_l3_faults_total", map[string]string{"kind": ""}); ok {
		t.Error("a miss was counted as a fault")
	}
	if n, err := testutil.GatherAndCount(reg, "strata_l3_ops_total"); err != nil || n != 9 {
		t.Errorf("ops series = %d, %v; want 9", n, err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	if got := strings.Join(fake.calls, "; "); got != "register kv; register draft; put kv 4; get kv 4; get kv 4; put kv 4; exists kv 4; exists kv 4; close" {
		t.Errorf("calls reached the backend as %q", got)
	}
}

func TestInstrumentTwiceOnOneRegistryIsAnError(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := storage.Instrument(&scriptedBackend{name: "file"}, reg); err != nil {
		t.Fatal(err)
	}
	_, err := storage.Instrument(&scriptedBackend{name: "file"}, reg)
	if are := (prometheus.AlreadyRegisteredError{}); !errors.As(err, &are) {
		t.Fatalf("second Instrument of backend %q returned %v, want prometheus.AlreadyRegisteredError", "file", err)
	}
	// A backend of another name shares the registry and the metric names.
	other, err := storage.Instrument(&scriptedBackend{name: "redis"}, reg)
	if err != nil {
		t.Fatalf("second backend name on one registry: %v", err)
	}
	other.Put(context.Background(), "kv", testKeys(t, 1), []pool.PageID{0})
	if v, ok := metricValue(t, reg, "strata_l3_ops_total", map[string]string{"backend": "redis", "op": "put"}); !ok || v != 1 {
		t.Fatalf("redis put ops = %v (%v)", v, ok)
	}
	// The failed registration left nothing behind: the registry still gathers.
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
}

func TestInstrumentRejectsNil(t *testing.T) {
	if _, err := storage.Instrument(&scriptedBackend{name: "x"}, nil); !errors.Is(err, storage.ErrConfig) {
		t.Errorf("nil registerer: %v", err)
	}
	if _, err := storage.Instrument(nil, prometheus.NewRegistry()); !errors.Is(err, storage.ErrConfig) {
		t.Errorf("nil backend: %v", err)
	}
}

func TestInstrumentUnwrap(t *testing.T) {
	fake := &scriptedBackend{name: "fake"}
	b, err := storage.Instrument(fake, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	u, ok := b.(interface{ Unwrap() storage.Backend })
	if !ok || u.Unwrap() != storage.Backend(fake) {
		t.Fatal("instrumented backend does not unwrap to the wrapped one")
	}
}
