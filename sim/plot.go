package sim

import (
	"bytes"
	"errors"
	"fmt"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/stratakv/strata/internal/atomicfile"
)

// ErrNoRuns reports a Report with no runs, which has nothing to plot.
var ErrNoRuns = errors.New("report has no runs")

// The figure is sized in pixels, the unit a reader of a PNG sees; vg works in points.
const (
	plotWidthPx  = 1200
	plotHeightPx = 500
	plotDPI      = vgimg.DefaultDPI
)

// pixels converts a pixel count at plotDPI to a vg length.
func pixels(n int) vg.Length { return vg.Length(n) * vg.Inch / plotDPI }

// WritePlot draws the report as a 1200x500 PNG at path: on the left each run's token
// hit ratio as bars stacked by the tier that served the tokens, on the right each
// run's TTFT p50 and p90 side by side. Like WriteJSON it replaces path atomically.
// A report with no runs has nothing to draw and returns ErrNoRuns.
func (r *Report) WritePlot(path string) error {
	if r == nil {
		return fmt.Errorf("plot %s: %w", path, errNilReport)
	}
	if len(r.Runs) == 0 {
		return fmt.Errorf("plot %s of %s report: %w", path, r.Workload, ErrNoRuns)
	}
	png, err := r.renderPlot()
	if err != nil {
		return fmt.Errorf("plot %s of %s report: %w", path, r.Workload, err)
	}
	return atomicfile.Write(path, png)
}

// renderPlot draws the figure and encodes it as PNG.
func (r *Report) renderPlot() ([]byte, error) {
	w, h := pixels(plotWidthPx), pixels(plotHeightPx)
	names := make([]string, len(r.Runs))
	for i, run := range r.Runs {
		names[i] = run.Name
	}
	// Bars share each panel's width between the runs, so many runs get thinner bars
	// instead of overlapping ones. The data area is a bit under half the figure.
	slot := (w/2 - vg.Points(80)) / vg.Length(len(r.Runs))

	hits, err := r.hitRatioPlot(names, min(vg.Points(60), slot*0.6))
	if err != nil {
		return nil, fmt.Errorf("hit ratio panel: %w", err)
	}
	ttft, err := r.ttftPlot(names, min(vg.Points(30), slot*0.35))
	if err != nil {
		return nil, fmt.Errorf("TTFT panel: %w", err)
	}

	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(plotDPI))
	dc := draw.New(img)

	title := plot.New().Title.TextStyle
	title.Font.Size = vg.Points(14)
	title.YAlign = draw.YTop
	const titleHeight = 30
	dc.FillText(title, vg.Point{X: dc.Center().X, Y: dc.Max.Y - vg.Points(8)}, r.plotTitle())
	dc.Max.Y -= vg.Points(titleHeight)

	tiles := draw.Tiles{
		Rows: 1, Cols: 2,
		PadX:   vg.Points(30),
		PadTop: vg.Points(4), PadBottom: vg.Points(10),
		PadLeft: vg.Points(10), PadRight: vg.Points(16),
	}
	panels := [][]*plot.Plot{{hits, ttft}}
	canvases := plot.Align(panels, tiles, dc)
	hits.Draw(canvases[0][0])
	ttft.Draw(canvases[0][1])

	var buf bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(&buf); err != nil {
		return nil, fmt.Errorf("encode PNG: %w", err)
	}
	return buf.Bytes(), nil
}

func (r *Report) plotTitle() string {
	t := fmt.Sprintf("strata bench: %s, %s", r.Workload, r.Model)
	if r.Draft != "" {
		t += " + draft " + r.Draft
	}
	return t + fmt.Sprintf(", seed %d", r.Seed)
}

// hitRatioPlot stacks each run's L1, L2 and L3 hit tokens as percentages of its
// prompt tokens, so the bar's height is the run's hit ratio.
func (r *Report) hitRatioPlot(names []string, barWidth vg.Length) (*plot.Plot, error) {
	tiers := [3]plotter.Values{}
	for i := range tiers {
		tiers[i] = make(plotter.Values, len(r.Runs))
	}
	for i, run := range r.Runs {
		// Split the reported ratio by each tier's share of the hits rather than
		// dividing by PromptTokens again, so the bar's height is exactly HitRatio.
		total := run.HitTokens.Total()
		if total <= 0 {
			continue
		}
		pct := 100 * finite(run.HitRatio)
		tiers[0][i] = pct * float64(run.HitTokens.L1) / float64(total)
		tiers[1][i] = pct * float64(run.HitTokens.L2) / float64(total)
		tiers[2][i] = pct * float64(run.HitTokens.L3) / float64(total)
	}

	p := plot.New()
	p.Title.Text = "token hit ratio by tier"
	p.Y.Label.Text = "hit ratio (%)"
	p.NominalX(names...)
	var below *plotter.BarChart
	for i, vs := range tiers {
		bars, err := plotter.NewBarChart(vs, barWidth)
		if err != nil {
			return nil, fmt.Errorf("bars of tier L%d: %w", i+1, err)
		}
		bars.Color = plotutil.Color(i)
		bars.LineStyle.Width = 0
		if below != nil {
			bars.StackOn(below)
		}
		below = bars
		p.Add(bars)
		p.Legend.Add(fmt.Sprintf("L%d", i+1), bars)
	}
	p.Legend.Top = true
	// Headroom above 100% keeps the legend clear of a full bar; the ticks stop at 100
	// so the axis still reads as a percentage.
	p.Y.Min, p.Y.Max = 0, 125
	p.Y.Tick.Marker = plot.ConstantTicks([]plot.Tick{
		{Value: 0, Label: "0"}, {Value: 25, Label: "25"}, {Value: 50, Label: "50"},
		{Value: 75, Label: "75"}, {Value: 100, Label: "100"},
	})
	return p, nil
}

// ttftPlot groups each run's TTFT p50 and p90 bars.
func (r *Report) ttftPlot(names []string, barWidth vg.Length) (*plot.Plot, error) {
	p50 := make(plotter.Values, len(r.Runs))
	p90 := make(plotter.Values, len(r.Runs))
	top := 0.0
	for i, run := range r.Runs {
		p50[i] = max(0, finite(run.TTFTms.P50))
		p90[i] = max(0, finite(run.TTFTms.P90))
		top = max(top, p50[i], p90[i])
	}

	p := plot.New()
	p.Title.Text = "time to first token"
	p.Y.Label.Text = "TTFT (ms)"
	p.NominalX(names...)
	for i, q := range []struct {
		name string
		vs   plotter.Values
	}{{"p50", p50}, {"p90", p90}} {
		bars, err := plotter.NewBarChart(q.vs, barWidth)
		if err != nil {
			return nil, fmt.Errorf("%s bars: %w", q.name, err)
		}
		// Colours after the tiers' so a p50 bar is not read as an L1 bar.
		bars.Color = plotutil.Color(3 + i)
		bars.LineStyle.Width = 0
		bars.Offset = barWidth * vg.Length(2*i-1) / 2
		p.Add(bars)
		p.Legend.Add(q.name, bars)
	}
	p.Legend.Top = true
	if top == 0 {
		// An all-zero axis has no scale; give it one so the panel still draws.
		top = 1
	}
	p.Y.Min, p.Y.Max = 0, top*1.3
	return p, nil
}

// finite maps NaN and infinities, which a degenerate run can produce and which the
// plotter rejects, to zero.
func finite(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	return f
}
