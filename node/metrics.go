package node

import (
	"github.com/prometheus/client_golang/prometheus"
)

// collector exports Stats on the admin port's /metrics.
type collector struct {
	s     *Server
	descs map[string]*prometheus.Desc
}

func newCollector(s *Server) *collector {
	c := &collector{s: s, descs: map[string]*prometheus.Desc{}}
	d := func(name, help string, labels ...string) {
		c.descs[name] = prometheus.NewDesc("strata_node_"+name, help, labels, nil)
	}
	d("clients", "Connected clients.")
	d("registered_bytes", "Memory registered by connected clients.")
	d("arena_bytes", "Arena size.")
	d("arena_used_bytes", "Arena bytes in allocated extents.")
	d("arena_objects", "Objects in the arena.")
	d("arena_fragmentation", "1 - largest free extent / free bytes.")
	d("arena_evictions_total", "Objects evicted from the arena, by where they went.", "to")
	d("spill_bytes", "Bytes in the spill directory.")
	d("requests_total", "Requests by kind.", "op")
	d("objects_total", "Objects moved, by direction and tier.", "op", "tier")
	d("bytes_total", "Object bytes moved between clients and the service.", "direction")
	d("misses_total", "Get objects found in no tier.")
	d("promotions_total", "Objects brought back from the spill directory into the arena.")
	d("errors_total", "Refused items and requests, by kind.", "kind")
	d("accepting", "1 while the socket accepts new clients, 0 while accepting fails (out of descriptors).")
	d("connections_total", "Connections that were not served to their end, by why: rejected (client limits), timed_out (hello, frame or idle timeout), accept_error (failed accepts, retried).", "result")
	d("request_memory_bytes", "Request memory held by requests in flight.")
	d("request_memory_limit_bytes", "The request memory budget (--request-memory).")
	// The write-through to Redis, exported only by a service that has one.
	d("remote_connected", "1 once the service has reached its Redis, else 0.")
	d("remote_queued_bytes", "Object bytes waiting to be written through to Redis.")
	d("remote_writes_total", "Objects queued for write-through, by outcome: written, failed (refused or a fault), dropped (never sent).", "result")
	d("remote_gets_total", "Local misses looked up in Redis, by outcome: hit (served, promoted when the arena had room) or miss.", "result")
	d("remote_faults_total", "Redis errors other than a miss.")
	return c
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	g := func(name string, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.GaugeValue, v, labels...)
	}
	n := func(name string, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.CounterValue, float64(v), labels...)
	}
	var reg int64
	for _, cl := range st.Clients {
		reg += cl.RegisteredBytes
	}
	g("clients", float64(len(st.Clients)))
	g("registered_bytes", float64(reg))
	g("arena_bytes", float64(st.Arena.SizeBytes))
	g("arena_used_bytes", float64(st.Arena.UsedBytes))
	g("arena_objects", float64(st.Arena.Objects))
	g("arena_fragmentation", st.Arena.Fragmentation)
	n("arena_evictions_total", st.Arena.Spilled, "spill")
	n("arena_evictions_total", st.Arena.Dropped, "dropped")
	var spill int64
	if st.Spill != nil {
		spill = st.Spill.Bytes
	}
	g("spill_bytes", float64(spill))
	o := st.Ops
	n("requests_total", o.Puts, "put")
	n("requests_total", o.Gets, "get")
	n("requests_total", o.Exists, "exists")
	n("objects_total", o.PutObjects, "put", "arena")
	n("objects_total", o.ArenaHits, "get", "arena")
	n("objects_total", o.SpillHits, "get", "spill")
	n("bytes_total", o.PutBytes, "in")
	n("bytes_total", o.GetBytes, "out")
	n("misses_total", o.Misses)
	n("promotions_total", o.Promotions)
	for kind, v := range map[string]int64{"bad_range": o.BadRanges, "no_space": o.NoSpace, "corrupt": o.Corrupt,
		"refused_registration": o.Refused, "malformed": o.Malformed, "spill": o.SpillErrors, "busy": o.Busy} {
		n("errors_total", v, kind)
	}
	accepting := 0.0
	if st.Accepting {
		accepting = 1
	}
	g("accepting", accepting)
	n("connections_total", o.Rejected, "rejected")
	n("connections_total", o.TimedOut, "timed_out")
	n("connections_total", o.AcceptErrors, "accept_error")
	n("errors_total", o.MemoryBusy, "memory_busy")
	g("request_memory_bytes", float64(st.RequestMemory.UsedBytes))
	g("request_memory_limit_bytes", float64(st.RequestMemory.LimitBytes))
	if r := st.Remote; r != nil {
		connected := 0.0
		if r.Connected {
			connected = 1
		}
		g("remote_connected", connected)
		g("remote_queued_bytes", float64(r.QueuedBytes))
		n("remote_writes_total", r.Written, "written")
		n("remote_writes_total", r.WriteFailed, "failed")
		n("remote_writes_total", r.Dropped, "dropped")
		n("remote_gets_total", r.Hits, "hit")
		n("remote_gets_total", r.Misses, "miss")
		n("remote_faults_total", r.Faults)
	}
}
