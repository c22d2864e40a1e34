package storagebench

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// RedisBenchmarkRef is Redis's own C client, redis-benchmark, getting values of
// the run's object size from the run's Redis server with pipelines as deep as
// a batch: a second reference beside the go-redis peer, free of any Go client's
// costs, for runs of small objects where the client's per-value work is most of
// the figure. It runs in rounds after the get phase, each round one
// redis-benchmark run and then the backend getting every batch again, so that
// each round's ratio compares two runs that met the same machine.
type RedisBenchmarkRef struct {
	// Command is the redis-benchmark command line, to rerun it by hand.
	Command string `json:"command"`
	// GetPerSec is the median of the GET requests a second redis-benchmark
	// reported in each round.
	GetPerSec float64 `json:"get_per_sec"`
	// BackendGetPerSec is the median of the backend's objects a second over
	// every batch in each round.
	BackendGetPerSec float64 `json:"backend_get_per_sec"`
	// Ratio is the backend's rate over redis-benchmark's, round by round.
	Ratio *RatioSpread `json:"ratio"`
}

// redisBenchmarkRounds is how many times the C client and the backend take
// turns.
const redisBenchmarkRounds = 5

// redisBenchmarkRequests is how many GETs (and SETs before them) the C client
// sends for values of size bytes in pipelines of depth: 100k, or fewer for
// values so large that they would move more than 256 MiB a round, but at least
// 8 pipelines.
func redisBenchmarkRequests(depth int, size int64) int {
	return max(depth*8, min(100_000, int((256<<20)/max(size, 1))))
}

// redisBenchmarkMaxBytes is the largest object the reference runs for: it is
// about per-value costs, and pipelines of megabyte values would only measure
// the copy that the go-redis peer measures already.
const redisBenchmarkMaxBytes = 64 << 10

// redisBenchmarkArgs is the command line of the reference: one connection as
// the backend's client has, pipelines of depth values of size bytes, SET then
// GET of one key (the C client's default: the value stays in the server's
// caches, Redis's best case).
func redisBenchmarkArgs(addr string, depth int, size int64) ([]string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	return []string{"-h", host, "-p", port, "-c", "1", "-P", strconv.Itoa(depth), "-d", strconv.FormatInt(size, 10),
		"-n", strconv.Itoa(redisBenchmarkRequests(depth, size)), "-t", "set,get", "--csv"}, nil
}

// runRedisBenchmark runs redis-benchmark (found in PATH) with args and returns
// the GET rate it reports.
func runRedisBenchmark(ctx context.Context, path string, args []string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("redis-benchmark: %w: %s", err, strings.TrimSpace(errOut.String()))
	}
	return parseRedisBenchmarkGet(&out)
}

// parseRedisBenchmarkGet reads the GET row's requests a second from
// redis-benchmark's --csv output ("test","rps",... then one row per test).
func parseRedisBenchmarkGet(r io.Reader) (float64, error) {
	rows, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark output: %w", err)
	}
	for _, row := range rows {
		if len(row) >= 2 && row[0] == "GET" {
			v, err := strconv.ParseFloat(row[1], 64)
			if err != nil || v <= 0 {
				return 0, fmt.Errorf("redis-benchmark output: GET rate %q is not a positive number", row[1])
			}
			return v, nil
		}
	}
	return 0, fmt.Errorf("redis-benchmark output has no GET row (%d rows)", len(rows))
}

// redisBenchmarkPhase runs the C client against the run's Redis server when
// redis-benchmark is in PATH and the server is the run's own, taking turns with
// the backend getting every batch again (see RedisBenchmarkRef). It says in a
// note why it did not run.
func (r *run) redisBenchmarkPhase(ctx context.Context) error {
	rp, ok := r.target.Redis.(*RedisPeer)
	if !ok || rp.Addr() == "" || r.target.PerBatch || r.shape.PartBytes() > redisBenchmarkMaxBytes {
		return nil
	}
	path, err := exec.LookPath("redis-benchmark")
	if err != nil {
		r.rep.Notes = append(r.rep.Notes, "redis-benchmark: not in PATH (it comes with redis-server's package, redis-tools); no C client reference")
		return nil
	}
	objects := r.cfg.PagesPerBatch * r.shape.Geometry.Buffers()
	args, err := redisBenchmarkArgs(rp.Addr(), objects, r.shape.PartBytes())
	if err != nil {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("redis-benchmark: address %s: %v", rp.Addr(), err))
		return nil
	}
	e := r.e
	dstPages := e.dstPages()
	dst := e.chunks(dstPages)
	var redisRates, ours, ratios []float64
	for round := range redisBenchmarkRounds {
		r.progress("redis-benchmark (C client) against the same redis-server, round %d/%d", round+1, redisBenchmarkRounds)
		rate, err := runRedisBenchmark(ctx, path, args)
		if err != nil {
			r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("redis-benchmark failed, no C client reference: %v", err))
			return nil
		}
		var took time.Duration
		for b := range r.cfg.Batches {
			d, err := e.timedGet(ctx, "get", b, dstPages, dst)
			if err != nil {
				return err
			}
			took += d
		}
		backend := float64(objects*r.cfg.Batches) / took.Seconds()
		redisRates, ours = append(redisRates, rate), append(ours, backend)
		ratios = append(ratios, backend/rate)
	}
	r.rep.RedisBenchmark = &RedisBenchmarkRef{
		Command:          "redis-benchmark " + strings.Join(args, " "),
		GetPerSec:        summarizeRatios(redisRates).Median,
		BackendGetPerSec: summarizeRatios(ours).Median,
		Ratio:            summarizeRatios(ratios),
	}
	return nil
}
