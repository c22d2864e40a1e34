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
	d("arena_used_bytes", "Arena bytes in allocated extents (slabs of small objects counted whole).")
	d("arena_held_bytes", "Arena bytes objects hold (their extents or slab slots); the watermarks apply to it.")
	d("arena_slabs", "Slabs of small objects in the arena.")
	d("arena_index_bytes", "Memory the arena's index has mapped outside the Go heap (records, key blocks, hash table).")
	d("arena_region_evictions_total", "Regions (an object's extent or a slab) evicted because least recently used victims did not make room.")
	d("arena_objects", "Objects in the arena.")
	d("arena_fragmentation", "1 - largest free extent / free bytes.")
	d("arena_evictions_total", "Objects evicted from the arena, by where they went.", "to")
	d("ready", "1 once the service is done starting (the arena warmed up and its file's objects recovered), 0 while it starts.")
	d("arena_ready_bytes", "Arena memory populated and given to objects so far.")
	d("arena_recovered_objects", "Objects this start recovered from the arena file, by outcome: recovered, lost (damaged, dropped), unsealed (put just before a kill, dropped).", "result")
	d("arena_unsealed_objects", "Large objects committed to the arena file and not sealed yet: what a kill now would drop.")
	d("arena_sealed_bytes_total", "Bytes of large objects sealed (hashed for a restart to check).")
	d("restarts", "Services started on the arena file before this one (kept in the file).")
	d("spill_bytes", "Bytes in the spill directory.")
	// The spill's segment files, exported only by a service that has a spill.
	d("spill_capacity_bytes", "The spill's bound in force: the smaller of --spill-capacity and the device's free space plus what the spill's files take.")
	d("spill_configured_capacity_bytes", "The spill's configured bound (--spill-capacity).")
	d("spill_objects", "Objects in the spill.")
	d("spill_removes_not_durable_total", "Objects removed from the spill whose tombstone may not be written: they may be back after a restart.")
	d("spill_live_bytes", "Data bytes of the objects in the spill.")
	d("spill_dead_bytes", "Bytes of the spill's segment files that hold no live object (removed, dropped and moved objects, tombstones, padding): compaction reclaims them, or they go with their segment.")
	d("spill_compactions_total", "Segment files the spill compacted: their live objects copied to the end of the spill, the file deleted.")
	d("spill_compacted_bytes_total", "Bytes of the segment files compaction deleted.")
	d("spill_compact_copied_bytes_total", "Bytes compaction copied forward (the rest of spill_compacted_bytes_total is space given back).")
	d("spill_segments", "Segment files in the spill.")
	d("spill_index_bytes", "Memory the spill's index has mapped outside the Go heap.")
	d("spill_buffered_bytes", "Bytes staged in the spill's write buffers and not yet written.")
	d("spill_writes_total", "Objects stored in the spill, by how: buffered (staged in a write buffer) or direct (written straight from the arena).", "how")
	d("spill_write_bytes_total", "Bytes of the objects stored in the spill.")
	d("spill_flushes_total", "Write buffers written to the spill's segment files.")
	d("spill_reads_total", "Objects read from the spill, by where from: file or buffer.", "from")
	d("spill_read_bytes_total", "Bytes of the objects read from the spill.")
	d("spill_dropped_total", "Objects the spill dropped, by why: segment (its oldest segment went to stay under the capacity), corrupt (a record failed its checks), lost (a failed write took it).", "why")
	d("spill_segments_dropped_total", "Segment files the spill dropped to stay under its capacity or the device's free space.")
	d("spill_write_errors_total", "Writes to the spill that failed, and retries after the device said it was full.", "kind")
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
	d("request_memory_held_back_total", "Requests that waited for request memory because their user held more than its share while another user wanted some.")
	d("request_memory_from_reserve_total", "Requests admitted from the reserve kept for users that hold little, the budget being full.")
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
	g("arena_held_bytes", float64(st.Arena.HeldBytes))
	g("arena_slabs", float64(st.Arena.Slabs))
	g("arena_index_bytes", float64(st.Arena.IndexBytes))
	n("arena_region_evictions_total", st.Arena.RegionEvictions)
	g("arena_objects", float64(st.Arena.Objects))
	g("arena_fragmentation", st.Arena.Fragmentation)
	n("arena_evictions_total", st.Arena.Spilled, "spill")
	n("arena_evictions_total", st.Arena.Dropped, "dropped")
	ready := 0.0
	if st.Start.State == StateReady {
		ready = 1
	}
	g("ready", ready)
	g("arena_ready_bytes", float64(st.Arena.ReadyBytes))
	g("arena_recovered_objects", float64(st.Start.Recovered), "recovered")
	g("arena_recovered_objects", float64(st.Start.Lost), "lost")
	g("arena_recovered_objects", float64(st.Start.Unsealed), "unsealed")
	g("arena_unsealed_objects", float64(st.Arena.Unsealed))
	n("arena_sealed_bytes_total", st.Arena.SealedBytes)
	g("restarts", float64(st.Start.Restarts))
	var spill int64
	if st.Spill != nil {
		spill = st.Spill.Bytes
	}
	g("spill_bytes", float64(spill))
	if sp := st.Spill; sp != nil {
		g("spill_capacity_bytes", float64(sp.CapacityBytes))
		g("spill_configured_capacity_bytes", float64(sp.ConfiguredCapacityBytes))
		g("spill_objects", float64(sp.Objects))
		n("spill_removes_not_durable_total", sp.RemovesNotDurable)
		g("spill_live_bytes", float64(sp.LiveBytes))
		g("spill_dead_bytes", float64(sp.DeadBytes))
		n("spill_compactions_total", sp.Compactions)
		n("spill_compacted_bytes_total", sp.CompactedBytes)
		n("spill_compact_copied_bytes_total", sp.CompactCopiedBytes)
		g("spill_segments", float64(sp.Files))
		g("spill_buffered_bytes", float64(sp.BufferedBytes))
		g("spill_index_bytes", float64(sp.IndexBytes))
		n("spill_writes_total", sp.Writes-sp.DirectWrites, "buffered")
		n("spill_writes_total", sp.DirectWrites, "direct")
		n("spill_write_bytes_total", sp.WriteBytes)
		n("spill_flushes_total", sp.Flushes)
		n("spill_reads_total", sp.Reads-sp.BufferReads, "file")
		n("spill_reads_total", sp.BufferReads, "buffer")
		n("spill_read_bytes_total", sp.ReadBytes)
		n("spill_dropped_total", sp.Evictions, "segment")
		n("spill_dropped_total", sp.CorruptRemoved, "corrupt")
		n("spill_dropped_total", sp.LostObjects, "lost")
		n("spill_segments_dropped_total", sp.SegmentsDropped)
		n("spill_write_errors_total", sp.WriteErrors, "failed")
		n("spill_write_errors_total", sp.NoSpaceRetries, "no_space_retried")
	}
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
		"refused_registration": o.Refused, "malformed": o.Malformed, "spill": o.SpillErrors, "busy": o.Busy, "past_deadline": o.PastDeadline} {
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
	n("request_memory_held_back_total", st.RequestMemory.HeldBack)
	n("request_memory_from_reserve_total", st.RequestMemory.FromReserve)
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
