package hicache

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/stratakv/strata/storage"
)

// Metrics exports a cache's counters to Prometheus. It is a collector over Stats
// snapshots, kept outside the cache so the cache stays about caching: register it
// on the registry the engine serves (never the global one). Names follow SGLang's
// HiCache metrics where one exists (prefetched_tokens_total,
// backuped_tokens_total, load_back_duration_seconds, eviction_duration_seconds,
// hicache_host_used_tokens, hicache_host_total_tokens), with the strata_ prefix.
type Metrics struct {
	cache *Cache
	ps    float64
	descs map[string]*prometheus.Desc
}

var _ prometheus.Collector = (*Metrics)(nil)

// NewMetrics returns the collector of c's metrics; constLabels (for example the
// engine's model and rank) are added to every series.
func NewMetrics(c *Cache, constLabels prometheus.Labels) *Metrics {
	m := &Metrics{cache: c, ps: float64(c.cfg.PageSize), descs: map[string]*prometheus.Desc{}}
	d := func(name, help string, labels ...string) {
		m.descs[name] = prometheus.NewDesc("strata_"+name, help, labels, constLabels)
	}
	d("requests_total", "Requests matched.")
	d("prompt_tokens_total", "Prompt tokens matched.")
	d("hit_tokens_total", "Prompt tokens served from the cache, by the tier they were found in.", "tier")
	d("draft_recompute_tokens_total", "Hit tokens whose draft KV was recomputed because a draft pool runs without L3.")
	d("inserted_tokens_total", "Tokens newly cached in L1.")
	d("load_back_tokens_total", "Tokens loaded from L2 into L1.")
	d("load_back_duration_seconds", "Duration of L2-to-L1 loads.")
	d("backup_l2_tokens_total", "Tokens copied from L1 into L2.")
	d("evicted_tokens_total", "Tokens evicted, by tier.", "tier")
	d("eviction_duration_seconds", "Duration of evictions.")
	d("copy_waits_total", "Times a request waited for L1-to-L2 copies to free L1 pages.")
	d("hicache_host_used_tokens", "Host (L2) pool tokens in use.")
	d("hicache_host_total_tokens", "Host (L2) pool capacity in tokens.")
	d("device_used_tokens", "Device (L1) pool tokens in use.")
	d("device_total_tokens", "Device (L1) pool capacity in tokens.")
	d("prefetched_tokens_total", "Tokens prefetched from L3 into L2.")
	d("backuped_tokens_total", "Tokens backed up from L2 to L3.")
	d("backup_skipped_tokens_total", "Tokens not backed up to L3: queue full or L3 down.")
	d("l3_refills_total", "Times the L3 backend came back emptied (a node service restarted cold) and the cache backed up its L2 again.")
	d("l3_refill_tokens_total", "Tokens queued for backup again after the L3 backend came back emptied.")
	d("l3_bytes_total", "Object bytes moved to or from L3; rate() of it is the prefetch (read) or backup (write) bandwidth.", "direction")
	d("prefetch_total", "L3 prefetches by how they ended.", "outcome")
	d("l3_faults_total", "L3 storage errors by kind.", "kind")
	d("l3_pool_enabled", "1 when the pool is registered with L3, 0 when it runs without.", "pool")
	d("l3_reserved_tokens", "Host tokens held by prefetches in flight.")
	d("l3_down", "1 while L3 calls are skipped after failures.")
	return m
}

// Describe sends every metric's description.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range m.descs {
		ch <- d
	}
}

// Collect sends a snapshot of the cache's counters.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	s := m.cache.Stats()
	counter := func(name string, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(m.descs[name], prometheus.CounterValue, v, labels...)
	}
	gauge := func(name string, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(m.descs[name], prometheus.GaugeValue, v, labels...)
	}
	hist := func(name string, h Histogram) {
		buckets := map[float64]uint64{}
		var cum uint64
		for i, b := range h.Bounds {
			if i < len(h.Counts) {
				cum += h.Counts[i]
			}
			buckets[b] = cum
		}
		ch <- prometheus.MustNewConstHistogram(m.descs[name], h.Count, h.Sum, buckets)
	}
	counter("requests_total", float64(s.Requests))
	counter("prompt_tokens_total", float64(s.PromptTokens))
	counter("hit_tokens_total", float64(s.HitTokensL1), "l1")
	counter("hit_tokens_total", float64(s.HitTokensL2), "l2")
	counter("hit_tokens_total", float64(s.HitTokensL3), "l3")
	counter("draft_recompute_tokens_total", float64(s.DraftRecomputeTokens))
	counter("inserted_tokens_total", float64(s.InsertedTokens))
	counter("load_back_tokens_total", float64(s.LoadBack.Pages)*m.ps)
	hist("load_back_duration_seconds", s.LoadBackSeconds)
	counter("backup_l2_tokens_total", float64(s.Backup.Pages)*m.ps)
	counter("evicted_tokens_total", float64(s.EvictedTokensL1), "l1")
	counter("evicted_tokens_total", float64(s.EvictedTokensL2), "l2")
	hist("eviction_duration_seconds", s.EvictionSeconds)
	counter("copy_waits_total", float64(s.CopyWaits))
	gauge("hicache_host_used_tokens", float64(s.HostPagesUsed)*m.ps)
	gauge("hicache_host_total_tokens", float64(s.HostPages)*m.ps)
	gauge("device_used_tokens", float64(s.DevicePagesUsed)*m.ps)
	gauge("device_total_tokens", float64(s.DevicePages)*m.ps)
	counter("prefetched_tokens_total", float64(s.L3.PrefetchedTokens))
	counter("backuped_tokens_total", float64(s.L3.BackedUpTokens))
	counter("backup_skipped_tokens_total", float64(s.L3.BackupSkippedPages)*m.ps)
	counter("l3_refills_total", float64(s.L3.Refills))
	counter("l3_refill_tokens_total", float64(s.L3.RefillPages)*m.ps)
	counter("l3_bytes_total", float64(s.L3.BytesRead), "read")
	counter("l3_bytes_total", float64(s.L3.BytesWritten), "write")
	p := s.L3.Prefetch
	for outcome, v := range map[string]int64{"completed": p.Completed, "timed_out": p.TimedOut, "canceled": p.Canceled,
		"below_threshold": p.BelowThreshold, "no_room": p.NoRoom, "failed": p.Failed, "stale": p.Stale, "joined": p.Joined} {
		counter("prefetch_total", float64(v), outcome)
	}
	for _, kind := range storage.FaultKinds() {
		counter("l3_faults_total", float64(s.L3.Faults[kind]), kind)
	}
	for _, ps := range s.L3.Pools {
		v := 0.0
		if ps.Enabled {
			v = 1
		}
		gauge("l3_pool_enabled", v, ps.Pool)
	}
	gauge("l3_reserved_tokens", float64(s.L3.ReservedPages)*m.ps)
	down := 0.0
	if s.L3.Down {
		down = 1
	}
	gauge("l3_down", down)
}
