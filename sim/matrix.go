package sim

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stratakv/strata/workload"
)

// MatrixConfig is `strata bench matrix`: every model preset on every workload,
// each a `strata bench` of its own on its defaults, measured from outside (wall
// time, peak resident memory, peak temporary disk), for the README's table of
// what each preset gives and needs.
type MatrixConfig struct {
	// Binary is the strata binary the runs start; empty means this process's
	// executable.
	Binary string
	// Models and Workloads choose the cells; empty means every preset and every
	// workload.
	Models    []string
	Workloads []string
	// Args are more `strata bench` flags for every run.
	Args []string
	// Repeat runs every cell this many times (at least 1): times on a shared
	// machine move, so the table gives their range.
	Repeat int
	// Progress gets one line per run; nil is silent.
	Progress io.Writer
}

// MatrixCell is one model on one workload.
type MatrixCell struct {
	Model    string `json:"model"`
	Workload string `json:"workload"`
	// Report is the last run's report.
	Report *Report `json:"report"`
	// Wall, MaxRSSBytes and TempDiskBytes are each run's wall time, peak
	// resident set and peak bytes under its temporary directory.
	Wall          []Duration `json:"wall"`
	MaxRSSBytes   []int64    `json:"max_rss_bytes"`
	TempDiskBytes []int64    `json:"temp_disk_bytes"`
	// LoadAverage is the machine's 1-minute load average before and after each
	// run, lowest and highest: what else ran meanwhile.
	LoadAverage [2]float64 `json:"load_average"`
}

// RunMatrix runs every cell, one run at a time. A run that fails ends the matrix
// with its error and the cells done so far.
func RunMatrix(ctx context.Context, cfg MatrixConfig) ([]MatrixCell, error) {
	models, workloads := cfg.Models, cfg.Workloads
	if len(models) == 0 {
		// The default model first, then by KV per token, as the README reads.
		models = ModelNames()
		slices.SortStableFunc(models, func(a, b string) int {
			ma, _ := ModelByName(a)
			mb, _ := ModelByName(b)
			return cmp.Or(cmp.Compare(btoi(b == DefaultModel), btoi(a == DefaultModel)),
				cmp.Compare(ma.Geometry.TokenBytes(), mb.Geometry.TokenBytes()))
		})
	}
	if len(workloads) == 0 {
		workloads = workload.Names()
	}
	for _, m := range models {
		if _, err := ModelByName(m); err != nil {
			return nil, err
		}
	}
	for _, w := range workloads {
		if _, err := workload.ByName(w); err != nil {
			return nil, fmt.Errorf("%v: %w", err, ErrConfig)
		}
	}
	bin := cfg.Binary
	if bin == "" {
		var err error
		if bin, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("find the strata binary to run the benches with: %w", err)
		}
	}
	repeat := max(cfg.Repeat, 1)
	var cells []MatrixCell
	for _, m := range models {
		for _, w := range workloads {
			cell := MatrixCell{Model: m, Workload: w, LoadAverage: [2]float64{math.Inf(1), math.Inf(-1)}}
			for range repeat {
				if err := runMatrixCell(ctx, bin, cfg.Args, &cell); err != nil {
					return cells, fmt.Errorf("%s on %s: %w", m, w, err)
				}
				if cfg.Progress != nil {
					i := len(cell.Wall) - 1
					st, _ := cell.Report.run(RunStrata)
					ceil, _ := cell.Report.run(RunCeiling)
					fmt.Fprintf(cfg.Progress, "%s %s: %s, %s peak RSS, %s temp disk; strata %s, ceiling %s (load average %.1f-%.1f)\n",
						m, w, formatWall(cell.Wall[i]), formatBytes(cell.MaxRSSBytes[i]), formatBytes(cell.TempDiskBytes[i]),
						formatPercent(st.HitRatio), formatPercent(ceil.HitRatio), cell.LoadAverage[0], cell.LoadAverage[1])
				}
			}
			cells = append(cells, cell)
		}
	}
	return cells, nil
}

// runMatrixCell runs one bench with a temporary directory of its own, whose size
// it samples while the bench runs.
func runMatrixCell(ctx context.Context, bin string, args []string, cell *MatrixCell) error {
	tmp, err := os.MkdirTemp("", "strata-matrix-")
	if err != nil {
		return fmt.Errorf("temporary directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	jsonPath := filepath.Join(tmp, "report.json")
	benchTmp := filepath.Join(tmp, "tmp")
	if err := os.Mkdir(benchTmp, 0o700); err != nil {
		return fmt.Errorf("temporary directory: %w", err)
	}
	argv := append([]string{"bench", "--model", cell.Model, "--workload", cell.Workload, "--json", jsonPath}, args...)
	cmd := exec.CommandContext(ctx, bin, argv...)
	cmd.Env = append(os.Environ(), "TMPDIR="+benchTmp)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	noteLoad(cell)
	stop := make(chan struct{})
	var peak int64
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			peak = max(peak, diskUsage(benchTmp))
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	start := time.Now()
	err = cmd.Run()
	wall := time.Since(start)
	close(stop)
	wg.Wait()
	noteLoad(cell)
	if err != nil {
		return fmt.Errorf("strata %s: %v: %s", strings.Join(argv, " "), err, lastLines(stderr.String(), 5))
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		return fmt.Errorf("read its report: %w", err)
	}
	var rep Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		return fmt.Errorf("read its report: %w", err)
	}
	var rss int64
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		rss = ru.Maxrss << 10 // kilobytes on Linux
	}
	cell.Report = &rep
	cell.Wall = append(cell.Wall, Duration(wall))
	cell.MaxRSSBytes = append(cell.MaxRSSBytes, rss)
	cell.TempDiskBytes = append(cell.TempDiskBytes, peak)
	return nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// diskUsage is the disk space the files under dir take (allocated blocks).
func diskUsage(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // removed meanwhile
		}
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// noteLoad widens the cell's range of load averages by the current one.
func noteLoad(cell *MatrixCell) {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return
	}
	f := strings.Fields(string(raw))
	if len(f) == 0 {
		return
	}
	if v, err := strconv.ParseFloat(f[0], 64); err == nil {
		cell.LoadAverage[0] = min(cell.LoadAverage[0], v)
		cell.LoadAverage[1] = max(cell.LoadAverage[1], v)
	}
}

// WriteMatrix writes the cells as the Markdown table of the README, then how it
// was measured.
func WriteMatrix(w io.Writer, cells []MatrixCell, command string) error {
	if len(cells) == 0 {
		return errors.New("write matrix: no cells")
	}
	var b bytes.Buffer
	b.WriteString("| model | workload | trace (scaled to the budget) | L1 + L2 of the tokens hit again | arrivals (load) | l1-only | strata | ceiling | gap | L3 hit tokens | TTFT p50 strata / l1-only | time | peak RSS | temp disk |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range cells {
		r := c.Report
		l1, _ := r.run(RunL1Only)
		st, _ := r.run(RunStrata)
		ceil, _ := r.run(RunCeiling)
		trace := fmt.Sprintf("%d requests, %s prompt tokens", r.Requests, groupDigits(r.PromptTokens))
		if r.Scaling != nil {
			trace += "; " + r.Scaling.Changed
		}
		tiers := fmt.Sprintf("%s + %s (%.0f%%)", groupDigits(r.L1Tokens), groupDigits(r.L2Tokens),
			100*float64(r.L1Tokens+r.L2Tokens)/float64(max(r.ReusedPrefixTokens, 1)))
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.2f/s (%.2f) | %s | %s | %s | %.1f | %s | %s / %s ms | %s | %s | %s |\n",
			c.Model, c.Workload, trace, tiers, r.Rate, r.Load,
			formatPercent(l1.HitRatio), formatPercent(st.HitRatio), formatPercent(ceil.HitRatio),
			roundedPoints(ceil.HitRatio)-roundedPoints(st.HitRatio),
			groupDigits(st.HitTokens.L3), formatMillis(st.TTFTms.P50), formatMillis(l1.TTFTms.P50),
			spread(c.Wall, func(d Duration) float64 { return time.Duration(d).Seconds() }, formatSecondsShort),
			spread(c.MaxRSSBytes, func(n int64) float64 { return float64(n) }, formatBytesFloat),
			spread(c.TempDiskBytes, func(n int64) float64 { return float64(n) }, formatBytesFloat))
		lo, hi = min(lo, c.LoadAverage[0]), max(hi, c.LoadAverage[1])
	}
	runs := len(cells[0].Wall)
	fmt.Fprintf(&b, "\n`%s`: %d runs of each, one at a time, on %d cores, load average %.1f-%.1f; time is the whole command's wall time, RSS its peak resident set, temp disk the peak of its temporary directory.\n",
		command, runs, runtime.NumCPU(), lo, hi)
	_, err := w.Write(b.Bytes())
	return err
}

// spread renders the lowest and highest of vs, or one figure when they render
// alike.
func spread[T any](vs []T, f func(T) float64, format func(float64) string) string {
	fs := make([]float64, len(vs))
	for i, v := range vs {
		fs[i] = f(v)
	}
	lo, hi := format(slices.Min(fs)), format(slices.Max(fs))
	if lo == hi {
		return lo
	}
	return lo + " - " + hi
}

// formatSecondsShort renders seconds to two figures.
func formatSecondsShort(s float64) string {
	if s < 10 {
		return strconv.FormatFloat(s, 'f', 1, 64) + " s"
	}
	return strconv.FormatFloat(s, 'f', 0, 64) + " s"
}

func formatBytesFloat(n float64) string { return formatBytes(int64(n)) }
