package storagebench

import (
	"slices"
	"time"
)

// gbps is the bandwidth over every batch and of each batch.
func (r *run) gbps(times []time.Duration) (float64, []float64) {
	return gbpsOf(float64(r.batchBytes()), times)
}

// gbpsOf is the bandwidth over every batch and of each batch, batch bytes each.
func gbpsOf(batch float64, times []time.Duration) (float64, []float64) {
	var sum time.Duration
	per := make([]float64, len(times))
	for i, d := range times {
		sum += d
		per[i] = rate(batch, d)
	}
	return rate(batch*float64(len(times)), sum), per
}

func rate(bytes float64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return bytes / d.Seconds() / 1e9
}

// ratio is a over b, 0 when b is not measured.
func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// describePeers names the peers in the report and takes their notes, while they
// are still open.
func (r *run) describePeers() {
	rep := r.rep
	rep.Peer = r.target.Peer.Name()
	if r.target.Stream != nil {
		rep.Stream = r.target.Stream.Name()
	}
	if r.target.Redis != nil {
		rep.Redis = r.target.Redis.Name()
	}
	for _, p := range []Peer{r.target.Peer, r.target.Stream, r.target.Redis} {
		if n, ok := p.(interface{ Notes() []string }); ok {
			for _, note := range n.Notes() {
				if !slices.Contains(rep.Notes, note) {
					rep.Notes = append(rep.Notes, note)
				}
			}
		}
	}
}

// finishReport takes the ratios: the median of the batches' ratios, each batch's
// backend and peer having run one right after the other.
func (r *run) finishReport() {
	rep := r.rep
	rep.PutRatio = medianOr(rep.PutRatioBatches, ratio(rep.PutGBps, rep.PeerPutGBps))
	rep.GetRatio = medianOr(rep.GetRatioBatches, ratio(rep.GetGBps, rep.PeerGetGBps))
	rep.PutVsRedis = medianOr(rep.PutVsRedisBatches, ratio(rep.PutGBps, rep.RedisPutGBps))
	rep.GetVsRedis = medianOr(rep.GetVsRedisBatches, ratio(rep.GetGBps, rep.RedisGetGBps))
	if t := rep.Engines; t != nil {
		t.PutRatio = medianOr(t.PutRatioBatches, ratio(t.PutGBps, t.PeerPutGBps))
		t.GetRatio = medianOr(t.GetRatioBatches, ratio(t.GetGBps, t.PeerGetGBps))
	}
	if r.cfg.Keep {
		rep.Dir = r.scratch
	}
}
