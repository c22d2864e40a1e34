package hicache

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stratakv/strata/hostmem"
)

func TestMetricsOnTheEnginesRegistry(t *testing.T) {
	backend := newMemBackend()
	backend.reject["draft"] = errors.New("refused")
	e := newEnvWith(t, l3Config(), 8, 32, Options{Storage: backend}, hostmem.Mmap)
	a := seq(1, 6*testPS)
	e.serve(t, a)
	e.serve(t, a)
	reg := prometheus.NewRegistry()
	if err := reg.Register(NewMetrics(e.cache, prometheus.Labels{"model": "test"})); err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP strata_hit_tokens_total Prompt tokens served from the cache, by the tier they were found in.
# TYPE strata_hit_tokens_total counter
strata_hit_tokens_total{model="test",tier="l1"} 24
strata_hit_tokens_total{model="test",tier="l2"} 0
strata_hit_tokens_total{model="test",tier="l3"} 0
# HELP strata_l3_pool_enabled 1 when the pool is registered with L3, 0 when it runs without.
# TYPE strata_l3_pool_enabled gauge
strata_l3_pool_enabled{model="test",pool="draft"} 0
strata_l3_pool_enabled{model="test",pool="kv"} 1
`), "strata_hit_tokens_total", "strata_l3_pool_enabled"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n < 30 {
		t.Fatalf("%d series, %v", n, err)
	}
	// A second registration of the same cache's metrics on one registry is refused.
	if err := reg.Register(NewMetrics(e.cache, prometheus.Labels{"model": "test"})); err == nil {
		t.Fatal("duplicate registration accepted")
	}
}
