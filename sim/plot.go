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
	plotWidthPx  = 1500
	plotHeightPx = 500
	plotDPI      = vgimg.DefaultDPI
)

// pixels converts a pixel count at plotDPI to a vg length.
func pixels(n int) vg.Length { return vg.Length(n) * vg.Inch / plotDPI }

// WritePlot draws the report as a 1500x500 PNG at path, in three panels: each
// run's token hit ratio as bars stacked by the tier that served the tokens (axis
// 0 to 100%), then each run's TTFT p50, then its p90, each on an axis of its own
// (p90s run to hundreds of milliseconds where p50s are a few, and on one linear
// axis the p50 bars vanished). Every bar is labelled with its value. Like
// WriteJSON it replaces path atomically. A report with no runs has nothing to
// draw and returns ErrNoRuns.
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
	// instead of overlapping ones. The data area is a bit under a third of the figure.
	slot := (w/3 - vg.Points(70)) / vg.Length(len(r.Runs))
	bar := min(vg.Points(60), slot*0.6)

	hits, err := r.hitRatioPlot(names, bar)
	if err != nil {
		return nil, fmt.Errorf("hit ratio panel: %w", err)
	}
	p50, err := r.ttftPlot(names, bar, "TTFT p50", func(q Quantiles) float64 { return q.P50 }, 3)
	if err != nil {
		return nil, fmt.Errorf("TTFT p50 panel: %w", err)
	}
	p90, err := r.ttftPlot(names, bar, "TTFT p90", func(q Quantiles) float64 { return q.P90 }, 4)
	if err != nil {
		return nil, fmt.Errorf("TTFT p90 panel: %w", err)
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
		Rows: 1, Cols: 3,
		PadX:   vg.Points(30),
		PadTop: vg.Points(4), PadBottom: vg.Points(10),
		PadLeft: vg.Points(10), PadRight: vg.Points(16),
	}
	panels := [][]*plot.Plot{{hits, p50, p90}}
	canvases := plot.Align(panels, tiles, dc)
	for i, p := range panels[0] {
		p.Draw(canvases[0][i])
	}

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
	// The axis is a percentage: it ends at 100. The legend sits above the data
	// area, beside the panel's title, where no bar reaches.
	p.Legend.Top = true
	p.Legend.YOffs = vg.Points(16)
	p.Y.Min, p.Y.Max = 0, 100
	p.Y.Tick.Marker = plot.ConstantTicks([]plot.Tick{
		{Value: 0, Label: "0"}, {Value: 25, Label: "25"}, {Value: 50, Label: "50"},
		{Value: 75, Label: "75"}, {Value: 100, Label: "100"},
	})
	top := make([]float64, len(r.Runs))
	text := make([]string, len(r.Runs))
	for i, run := range r.Runs {
		top[i] = min(100, 100*max(0, finite(run.HitRatio)))
		text[i] = formatPercent(finite(run.HitRatio))
	}
	if err := addValueLabels(p, top, text, 100); err != nil {
		return nil, err
	}
	return p, nil
}

// addValueLabels writes each bar's value above it (inside it, near the top, when
// the bar reaches the axis's end).
func addValueLabels(p *plot.Plot, heights []float64, text []string, axisMax float64) error {
	xys := make(plotter.XYs, len(heights))
	for i, h := range heights {
		xys[i] = plotter.XY{X: float64(i), Y: h}
	}
	labels, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: text})
	if err != nil {
		return fmt.Errorf("value labels: %w", err)
	}
	for i := range labels.TextStyle {
		labels.TextStyle[i].XAlign = draw.XCenter
		labels.TextStyle[i].YAlign = draw.YBottom
		if heights[i] > 0.92*axisMax {
			// No room above: the label goes just inside the bar's top.
			labels.TextStyle[i].YAlign = draw.YTop
			labels.XYs[i].Y = heights[i] - 0.02*axisMax
		}
	}
	labels.Offset.Y = vg.Points(2)
	p.Add(labels)
	return nil
}

// ttftPlot draws one TTFT quantile per run, on an axis from 0 to a little above
// the largest, each bar labelled with its milliseconds.
func (r *Report) ttftPlot(names []string, barWidth vg.Length, title string, q func(Quantiles) float64, color int) (*plot.Plot, error) {
	vs := make(plotter.Values, len(r.Runs))
	text := make([]string, len(r.Runs))
	top := 0.0
	for i, run := range r.Runs {
		vs[i] = max(0, finite(q(run.TTFTms)))
		text[i] = formatMillis(vs[i])
		top = max(top, vs[i])
	}
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = "TTFT (ms)"
	p.NominalX(names...)
	bars, err := plotter.NewBarChart(vs, barWidth)
	if err != nil {
		return nil, fmt.Errorf("%s bars: %w", title, err)
	}
	// Colours after the tiers' so a TTFT bar is not read as an L1 bar.
	bars.Color = plotutil.Color(color)
	bars.LineStyle.Width = 0
	p.Add(bars)
	if top == 0 {
		// An all-zero axis has no scale; give it one so the panel still draws.
		top = 1
	}
	p.Y.Min, p.Y.Max = 0, top*1.15
	if err := addValueLabels(p, vs, text, p.Y.Max); err != nil {
		return nil, err
	}
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
