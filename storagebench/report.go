package storagebench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/stratakv/strata/internal/atomicfile"
)

// Report is the result of one run. Bandwidths are in GB/s (10^9 bytes a second) of
// object bytes; ratios are the backend's bandwidth over its peer's measured in the
// same run, so 1.0 means as fast as the disk doing the same job with no store.
type Report struct {
	// Backend is the backend measured and BackendSettings how it was configured.
	Backend         string `json:"backend"`
	BackendSettings string `json:"backend_settings,omitempty"`
	// Shape is the page shape's name and Geometry its KV geometry.
	Shape    string `json:"shape"`
	Geometry string `json:"geometry"`
	// PageBytes is one page (every part); PartBytes one object part.
	PageBytes int64 `json:"page_bytes"`
	PartBytes int64 `json:"part_bytes"`
	// PagesPerBatch and Batches: each batch is one Put and one Get call.
	PagesPerBatch int `json:"pages_per_batch"`
	Batches       int `json:"batches"`
	// Bytes is what was put, and read back, in all.
	Bytes int64 `json:"bytes"`
	// HostAllocator and HostPoolBytes describe the host pool the pages came from.
	HostAllocator string `json:"host_allocator"`
	HostPoolBytes int64  `json:"host_pool_bytes"`
	// PutGBps and GetGBps are the backend's bandwidth over every batch.
	PutGBps float64 `json:"put_gbps"`
	GetGBps float64 `json:"get_gbps"`
	// ColdPutGBps and ColdGetGBps are the untimed first batch of a target that
	// warms the host pool up: the first use of each page of the pool.
	ColdPutGBps float64 `json:"cold_put_gbps,omitempty"`
	ColdGetGBps float64 `json:"cold_get_gbps,omitempty"`
	// PutBatchGBps and GetBatchGBps are each batch's figure, to show the spread.
	PutBatchGBps []float64 `json:"put_batch_gbps"`
	GetBatchGBps []float64 `json:"get_batch_gbps"`
	// Peer is what the backend is measured against, and its bandwidths.
	Peer        string  `json:"peer"`
	PeerPutGBps float64 `json:"peer_put_gbps"`
	PeerGetGBps float64 `json:"peer_get_gbps"`
	// PutRatio and GetRatio are backend over peer: the median of the batches'
	// ratios in PutRatioBatches and GetRatioBatches. Where the target has a
	// one-stream peer too, each put batch is compared with the faster of the two
	// peers on that batch.
	PutRatio float64 `json:"put_ratio"`
	GetRatio float64 `json:"get_ratio"`
	// PutRatioBatches and GetRatioBatches are the ratios batch by batch (the
	// backend and its peers alternate on every batch): median and min-max.
	PutRatioBatches *RatioSpread `json:"put_ratio_batches,omitempty"`
	GetRatioBatches *RatioSpread `json:"get_ratio_batches,omitempty"`
	// Stream is the one-stream figure of the medium, when the target has one.
	Stream        string  `json:"stream,omitempty"`
	StreamPutGBps float64 `json:"stream_put_gbps,omitempty"`
	StreamGetGBps float64 `json:"stream_get_gbps,omitempty"`
	// Redis is the Redis server measured beside the backend on the same batches and
	// objects, when there was one; RedisPutGBps and RedisGetGBps its bandwidths.
	Redis        string  `json:"redis,omitempty"`
	RedisPutGBps float64 `json:"redis_put_gbps,omitempty"`
	RedisGetGBps float64 `json:"redis_get_gbps,omitempty"`
	// RedisPutBatchGBps and RedisGetBatchGBps are each batch's figure.
	RedisPutBatchGBps []float64 `json:"redis_put_batch_gbps,omitempty"`
	RedisGetBatchGBps []float64 `json:"redis_get_batch_gbps,omitempty"`
	// PutVsRedis and GetVsRedis are the backend's bandwidth over Redis's: the
	// median of the batches' ratios in PutVsRedisBatches and GetVsRedisBatches.
	PutVsRedis float64 `json:"put_vs_redis,omitempty"`
	GetVsRedis float64 `json:"get_vs_redis,omitempty"`
	// PutVsRedisBatches and GetVsRedisBatches are those ratios batch by batch.
	PutVsRedisBatches *RatioSpread `json:"put_vs_redis_batches,omitempty"`
	GetVsRedisBatches *RatioSpread `json:"get_vs_redis_batches,omitempty"`
	// RedisBenchmark is Redis's C client on the same server, for node runs of
	// objects up to 64 KiB when redis-benchmark is installed.
	RedisBenchmark *RedisBenchmarkRef `json:"redis_benchmark,omitempty"`
	// Engines is the phase with several engines at once (two unless
	// Config.Engines), for backends a node's engines share.
	Engines *ManyEngines `json:"engines,omitempty"`
	// ExistsCalls Exists calls of ExistsKeys keys each, all present: latency percentiles.
	ExistsCalls int     `json:"exists_calls"`
	ExistsKeys  int     `json:"exists_keys"`
	ExistsP50us float64 `json:"exists_p50_us"`
	ExistsP99us float64 `json:"exists_p99_us"`
	// MismatchedPages counts pages that Get returned without error but whose bytes
	// differ from what was put. Anything but 0 is a bug in the backend.
	MismatchedPages int64 `json:"mismatched_pages"`
	// Dir is the scratch directory, when it was kept.
	Dir string `json:"dir,omitempty"`
	// ElapsedSeconds is the whole run, setup included.
	ElapsedSeconds float64 `json:"elapsed_s"`
	// Notes say how the figures were taken and what may skew them.
	Notes []string `json:"notes"`
}

var errNilReport = errors.New("report is nil")

// WriteTable writes the report for a terminal: what was measured, one row per
// direction with the backend, its peer and their ratio, the Exists latency, the
// mismatch count and the notes. It renders into memory first, so a failing writer
// never gets half a table.
func (r *Report) WriteTable(w io.Writer) error {
	if r == nil {
		return fmt.Errorf("write table: %w", errNilReport)
	}
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	backend := r.Backend
	if r.BackendSettings != "" {
		backend += " (" + r.BackendSettings + ")"
	}
	fmt.Fprintf(tw, "backend\t%s\n", backend)
	parts := "1 object"
	if r.PartBytes > 0 && r.PageBytes/r.PartBytes > 1 {
		parts = fmt.Sprintf("%d objects", r.PageBytes/r.PartBytes)
	}
	fmt.Fprintf(tw, "page\t%s, %s (%s) = %s of %s\n", r.Shape, r.Geometry, formatBytes(r.PageBytes), parts, formatBytes(r.PartBytes))
	fmt.Fprintf(tw, "batches\t%d x %d pages, %s put and read back\n", r.Batches, r.PagesPerBatch, formatBytes(r.Bytes))
	fmt.Fprintf(tw, "host pool\t%s, %s\n", r.HostAllocator, formatBytes(r.HostPoolBytes))
	fmt.Fprintf(tw, "peer\t%s\n", r.Peer)
	if r.Stream != "" {
		fmt.Fprintf(tw, "one stream\t%s\n", r.Stream)
	}
	if r.Redis != "" {
		fmt.Fprintf(tw, "redis\t%s\n", r.Redis)
	}
	if t := r.Engines; t != nil {
		fmt.Fprintf(tw, "%d engines\t%d clients at once, own host pools and keys; peer %s\n", t.Engines, t.Engines, t.Peer)
	}
	if r.ColdPutGBps > 0 || r.ColdGetGBps > 0 {
		fmt.Fprintf(tw, "cold batch\tput %s GB/s, get %s GB/s (untimed warm-up: first touch of the host pool's pages by the service)\n",
			formatGBps(r.ColdPutGBps), formatGBps(r.ColdGetGBps))
	}
	if r.Dir != "" {
		fmt.Fprintf(tw, "kept\t%s\n", r.Dir)
	}
	fmt.Fprintf(tw, "elapsed\t%.1fs\n", r.ElapsedSeconds)
	_ = tw.Flush()
	buf.WriteByte('\n')

	var table bytes.Buffer
	tw = tabwriter.NewWriter(&table, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "GB/s\tbatch min-max\tpeer GB/s\tratio (min-max)\t"
	if r.Stream != "" {
		head += "one stream GB/s\t"
	}
	if r.Redis != "" {
		head += "redis GB/s\tredis min-max\tx redis\t"
	}
	fmt.Fprintln(tw, head)
	row := func(gbps float64, batches []float64, peer float64, ratio *RatioSpread, stream, redis float64, redisBatches []float64, vsRedis *RatioSpread) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t", formatGBps(gbps), formatSpread(batches), formatGBps(peer), formatRatioSpread(ratio))
		if r.Stream != "" {
			fmt.Fprintf(tw, "%s\t", formatGBps(stream))
		}
		if r.Redis != "" {
			fmt.Fprintf(tw, "%s\t%s\t%s\t", formatGBps(redis), formatSpread(redisBatches), formatRatioSpread(vsRedis))
		}
		fmt.Fprintln(tw)
	}
	row(r.PutGBps, r.PutBatchGBps, r.PeerPutGBps, orMedian(r.PutRatioBatches, r.PutRatio), r.StreamPutGBps, r.RedisPutGBps, r.RedisPutBatchGBps,
		orMedian(r.PutVsRedisBatches, r.PutVsRedis))
	row(r.GetGBps, r.GetBatchGBps, r.PeerGetGBps, orMedian(r.GetRatioBatches, r.GetRatio), r.StreamGetGBps, r.RedisGetGBps, r.RedisGetBatchGBps,
		orMedian(r.GetVsRedisBatches, r.GetVsRedis))
	_ = tw.Flush()
	writeRows(&buf, table.Bytes(), "", "put", "get")
	buf.WriteByte('\n')
	if t := r.Engines; t != nil {
		table.Reset()
		tw = tabwriter.NewWriter(&table, 0, 0, 2, ' ', tabwriter.AlignRight)
		// Two engines show each one's figure; more show the slowest and fastest.
		head := "GB/s\tbatch min-max\tengine 1\tengine 2\tpeer GB/s\tratio (min-max)\t"
		if t.Engines > 2 {
			head = "GB/s\tbatch min-max\tengine min-max\tpeer GB/s\tratio (min-max)\t"
		}
		fmt.Fprintln(tw, head)
		row := func(gbps float64, batches, engines []float64, peer float64, ratio *RatioSpread) {
			var each string
			if t.Engines > 2 {
				each = formatSpread(engines)
			} else {
				e := []float64{0, 0}
				copy(e, engines)
				each = formatGBps(e[0]) + "\t" + formatGBps(e[1])
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", formatGBps(gbps), formatSpread(batches), each,
				formatGBps(peer), formatRatioSpread(ratio))
		}
		row(t.PutGBps, t.PutBatchGBps, t.EnginePutGBps, t.PeerPutGBps, orMedian(t.PutRatioBatches, t.PutRatio))
		row(t.GetGBps, t.GetBatchGBps, t.EngineGetGBps, t.PeerGetGBps, orMedian(t.GetRatioBatches, t.GetRatio))
		_ = tw.Flush()
		writeRows(&buf, table.Bytes(), fmt.Sprintf("%d engines", t.Engines), "put", "get")
		buf.WriteByte('\n')
	}
	if rb := r.RedisBenchmark; rb != nil {
		fmt.Fprintf(&buf, "redis-benchmark (C client, %d rounds alternated with %s gets): GET %s/s, %s %s objects/s: %s\n  %s\n",
			rb.Ratio.Batches, r.Backend, formatCount(rb.GetPerSec), r.Backend, formatCount(rb.BackendGetPerSec), formatRatioSpread(rb.Ratio), rb.Command)
	}
	if r.ExistsCalls > 0 {
		fmt.Fprintf(&buf, "exists of %d keys: p50 %s us, p99 %s us (%d calls)\n",
			r.ExistsKeys, formatMicros(r.ExistsP50us), formatMicros(r.ExistsP99us), r.ExistsCalls)
	}
	if r.MismatchedPages > 0 {
		fmt.Fprintf(&buf, "MISMATCHED PAGES: %d pages read back with bytes that differ from what was put\n", r.MismatchedPages)
	} else {
		buf.WriteString("mismatched pages: 0\n")
	}
	if len(r.Notes) > 0 {
		buf.WriteString("\nnotes:\n")
		for _, n := range r.Notes {
			buf.WriteString("  - " + n + "\n")
		}
	}
	if _, err := w.Write(trimLineEnds(buf.Bytes())); err != nil {
		return fmt.Errorf("write table of %s benchmark: %w", r.Backend, err)
	}
	return nil
}

// writeRows writes the lines of a rendered table, each behind its name, the
// names padded to one width.
func writeRows(buf *bytes.Buffer, table []byte, names ...string) {
	width := 0
	for _, n := range names {
		width = max(width, len(n))
	}
	i := 0
	for line := range bytes.Lines(table) {
		name := ""
		if i < len(names) {
			name = names[i]
		}
		fmt.Fprintf(buf, "%-*s %s", width, name, line)
		i++
	}
}

// WriteJSON writes the report as indented JSON to path, through a temporary file
// in the same directory and a rename, so a reader sees the old file or the new
// one, never half.
func (r *Report) WriteJSON(path string) (err error) {
	if r == nil {
		return fmt.Errorf("write report %s: %w", path, errNilReport)
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("write report %s: encode: %w", path, err)
	}
	data = append(data, '\n')
	if err := atomicfile.Write(path, data); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

func formatGBps(v float64) string {
	if v <= 0 {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func formatRatio(v float64) string {
	if v <= 0 {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', 2, 64) + "x"
}

// formatCount renders a rate such as 812k or 1.25M.
func formatCount(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', 2, 64) + "M"
	case v >= 1e3:
		return strconv.FormatFloat(v/1e3, 'f', 0, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

func formatMicros(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }

func formatSpread(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	lo, hi := v[0], v[0]
	for _, x := range v {
		lo, hi = min(lo, x), max(hi, x)
	}
	return formatGBps(lo) + "-" + formatGBps(hi)
}

// formatBytes renders n in binary units ("4.0 MiB").
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	f, i := float64(n), -1
	for f >= unit && i < 5 {
		f /= unit
		i++
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + " " + string("KMGTPE"[i]) + "iB"
}

// trimLineEnds removes the blanks tabwriter leaves at the end of lines.
func trimLineEnds(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for line := range bytes.Lines(b) {
		out = append(out, bytes.TrimRight(line, " \n")...)
		if bytes.HasSuffix(line, []byte("\n")) {
			out = append(out, '\n')
		}
	}
	return out
}
