package storage

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
)

// Operation names, the op label of the L3 metrics.
const (
	OpRegister = "register"
	OpExists   = "exists"
	OpGet      = "get"
	OpPut      = "put"
	OpClose    = "close"
)

// Call results, the result label of strata_l3_ops_total.
const (
	// ResultOK: the call succeeded for every key.
	ResultOK = "ok"
	// ResultMiss: a get found some keys missing (ErrNotFound) and faulted on none;
	// an exists call never reports it (a short answer is a normal one).
	ResultMiss = "miss"
	// ResultPartial: some keys of a get or put faulted and some did not.
	ResultPartial = "partial"
	// ResultError: the call failed: every key faulted, or a call without keys
	// (register, exists, close) returned an error.
	ResultError = "error"
)

// Key results, the result label of strata_l3_keys_total.
const (
	KeyOK    = "ok"
	KeyMiss  = "miss"
	KeyFault = "fault"
)

// l3Metrics are one backend's collectors on one registry. The backend name is a
// constant label, so several backends share a registry and the metric names, and a
// second registration of the same backend name is refused with
// prometheus.AlreadyRegisteredError instead of double counting.
type l3Metrics struct {
	ops      *prometheus.CounterVec
	duration *prometheus.HistogramVec
	bytes    *prometheus.CounterVec
	keys     *prometheus.CounterVec
	faults   *prometheus.CounterVec
}

func newL3Metrics(backend string) *l3Metrics {
	cl := prometheus.Labels{"backend": backend}
	return &l3Metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "strata_l3_ops_total",
			Help:        "L3 backend calls by operation and result (ok, miss, partial, error).",
			ConstLabels: cl,
		}, []string{"op", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:        "strata_l3_op_duration_seconds",
			Help:        "Wall time of L3 backend calls by operation.",
			ConstLabels: cl,
			// Half-decade buckets from 10 µs (an exists on a local service) to 10 s (a
			// full batch of large pages to a slow disk or a remote cluster).
			Buckets: prometheus.ExponentialBucketsRange(10e-6, 10, 13),
		}, []string{"op"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "strata_l3_bytes_total",
			Help: "Object bytes moved by L3 get and put: pages that succeeded times the pool's page bytes " +
				"(every part). A put of a key that already existed counts, though write-once moves no data for it.",
			ConstLabels: cl,
		}, []string{"op"}),
		keys: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "strata_l3_keys_total",
			Help:        "Keys named in L3 exists, get and put calls by outcome (ok, miss, fault).",
			ConstLabels: cl,
		}, []string{"op", "result"}),
		faults: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "strata_l3_faults_total",
			Help: "L3 faults by kind (storage.FaultKind): one per faulted key of a get or put, " +
				"one per failed register, exists or close call. Misses are not faults.",
			ConstLabels: cl,
		}, []string{"kind"}),
	}
}

func (m *l3Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.ops, m.duration, m.bytes, m.keys, m.faults}
}

// register registers every collector or none.
func (m *l3Metrics) register(reg prometheus.Registerer) error {
	var done []prometheus.Collector
	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			for _, d := range done {
				reg.Unregister(d)
			}
			return err
		}
		done = append(done, c)
	}
	return nil
}

// Instrument wraps b so that every call is counted and timed on reg:
// strata_l3_ops_total{backend,op,result}, strata_l3_op_duration_seconds{backend,op}
// (histogram), strata_l3_bytes_total{backend,op} (object bytes moved: pages
// succeeded × the pool's page-buffer bytes × parts), strata_l3_keys_total{backend,op,result}
// and strata_l3_faults_total{backend,kind} (FaultKind). The backend label is b.Name().
//
// reg must not be nil; there is no fallback to a global registry. Wrapping two
// backends of the same name on one registry fails with
// prometheus.AlreadyRegisteredError (test it with errors.As), so a backend is never
// counted twice. The wrapper keeps nothing but the layouts of registered pools,
// which it needs to turn pages into bytes.
func Instrument(b Backend, reg prometheus.Registerer) (Backend, error) {
	if b == nil {
		return nil, fmt.Errorf("instrument: no backend: %w", ErrConfig)
	}
	if reg == nil {
		return nil, fmt.Errorf("instrument %s backend: no prometheus registerer (pass one; strata never uses the global registry): %w", b.Name(), ErrConfig)
	}
	m := newL3Metrics(b.Name())
	if err := m.register(reg); err != nil {
		if are := (prometheus.AlreadyRegisteredError{}); errors.As(err, &are) {
			return nil, fmt.Errorf("instrument %s backend: its metrics are already registered on this registry "+
				"(wrap each backend once, or give backends distinct names): %w", b.Name(), err)
		}
		return nil, fmt.Errorf("instrument %s backend: %w", b.Name(), err)
	}
	return &instrumented{b: b, m: m, pageBytes: map[string]int64{}}, nil
}

// instrumented is the Backend that Instrument returns.
type instrumented struct {
	b Backend
	m *l3Metrics

	mu        sync.RWMutex
	pageBytes map[string]int64 // pool name → bytes of one page's object (every part)
}

var _ Backend = (*instrumented)(nil)

// Unwrap returns the backend that Instrument wrapped.
func (in *instrumented) Unwrap() Backend { return in.b }

func (in *instrumented) Name() string { return in.b.Name() }

func (in *instrumented) Allocator() hostmem.Kind { return in.b.Allocator() }

func (in *instrumented) RegisterPool(ctx context.Context, spec PoolSpec) error {
	start := time.Now()
	err := in.b.RegisterPool(ctx, spec)
	in.observeCall(OpRegister, start, err)
	if err == nil {
		l := spec.Layout
		in.mu.Lock()
		in.pageBytes[spec.Name] = l.PageBufferBytes() * int64(l.Geometry.Buffers())
		in.mu.Unlock()
	}
	return err
}

func (in *instrumented) Exists(ctx context.Context, pool string, keys []pagekey.Key) (int, error) {
	start := time.Now()
	n, err := in.b.Exists(ctx, pool, keys)
	in.observeCall(OpExists, start, err)
	if err == nil {
		in.m.keys.WithLabelValues(OpExists, KeyOK).Add(float64(n))
		in.m.keys.WithLabelValues(OpExists, KeyMiss).Add(float64(len(keys) - n))
	}
	return n, err
}

func (in *instrumented) Get(ctx context.Context, pool string, keys []pagekey.Key, pages []pool.PageID) []error {
	start := time.Now()
	errs := in.b.Get(ctx, pool, keys, pages)
	in.observeBatch(OpGet, pool, start, errs)
	return errs
}

func (in *instrumented) Put(ctx context.Context, pool string, keys []pagekey.Key, pages []pool.PageID) []error {
	start := time.Now()
	errs := in.b.Put(ctx, pool, keys, pages)
	in.observeBatch(OpPut, pool, start, errs)
	return errs
}

func (in *instrumented) Close() error {
	start := time.Now()
	err := in.b.Close()
	in.observeCall(OpClose, start, err)
	return err
}

// observeCall records a call without per-key results.
func (in *instrumented) observeCall(op string, start time.Time, err error) {
	in.m.duration.WithLabelValues(op).Observe(time.Since(start).Seconds())
	result := ResultOK
	if err != nil {
		result = ResultError
		in.m.faults.WithLabelValues(faultKindOrIO(err)).Inc()
	}
	in.m.ops.WithLabelValues(op, result).Inc()
}

// observeBatch records a get or put from its per-key results.
func (in *instrumented) observeBatch(op, pool string, start time.Time, errs []error) {
	in.m.duration.WithLabelValues(op).Observe(time.Since(start).Seconds())
	var ok, miss, fault int
	for _, err := range errs {
		switch kind := FaultKind(err); {
		case err == nil:
			ok++
		case kind == "":
			miss++
		default:
			fault++
			in.m.faults.WithLabelValues(kind).Inc()
		}
	}
	result := ResultOK
	switch {
	case fault > 0 && fault == len(errs):
		result = ResultError
	case fault > 0:
		result = ResultPartial
	case miss > 0:
		result = ResultMiss
	}
	in.m.ops.WithLabelValues(op, result).Inc()
	for _, kr := range [...]struct {
		label string
		n     int
	}{{KeyOK, ok}, {KeyMiss, miss}, {KeyFault, fault}} {
		if kr.n > 0 {
			in.m.keys.WithLabelValues(op, kr.label).Add(float64(kr.n))
		}
	}
	if ok > 0 {
		in.mu.RLock()
		per := in.pageBytes[pool]
		in.mu.RUnlock()
		in.m.bytes.WithLabelValues(op).Add(float64(int64(ok) * per))
	}
}

// faultKindOrIO is FaultKind for a call-level error, where ErrNotFound (which
// FaultKind does not count) still failed the call.
func faultKindOrIO(err error) string {
	if k := FaultKind(err); k != "" {
		return k
	}
	return "io"
}
