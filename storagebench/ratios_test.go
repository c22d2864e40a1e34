package storagebench

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestPairedRatiosMedianAndRange(t *testing.T) {
	ms := time.Millisecond
	// Batch ratios peer/ours: 2/1=2, 3/6=0.5, 4/4=1, 9/3=3, 5/5=1.
	ours := []time.Duration{1 * ms, 6 * ms, 4 * ms, 3 * ms, 5 * ms}
	peer := []time.Duration{2 * ms, 3 * ms, 4 * ms, 9 * ms, 5 * ms}
	got := pairedRatios(ours, peer)
	want := RatioSpread{Median: 1, Min: 0.5, Max: 3, Batches: 5}
	if got == nil || *got != want {
		t.Fatalf("pairedRatios = %+v, want %+v", got, want)
	}
	// The caller's times are not reordered.
	if ours[0] != 1*ms || peer[1] != 3*ms {
		t.Fatalf("pairedRatios reordered its input: %v %v", ours, peer)
	}
}

func TestPairedRatiosEvenCountTakesMeanOfMiddle(t *testing.T) {
	ms := time.Millisecond
	// Ratios 1, 2, 4, 8: the median is (2+4)/2.
	got := pairedRatios([]time.Duration{8 * ms, 4 * ms, 2 * ms, 1 * ms}, []time.Duration{8 * ms, 8 * ms, 8 * ms, 8 * ms})
	want := RatioSpread{Median: 3, Min: 1, Max: 8, Batches: 4}
	if got == nil || *got != want {
		t.Fatalf("pairedRatios = %+v, want %+v", got, want)
	}
}

func TestPairedRatiosAgainstTheFasterPeerOfEachBatch(t *testing.T) {
	ms := time.Millisecond
	ours := []time.Duration{10 * ms, 10 * ms, 10 * ms}
	writers := []time.Duration{5 * ms, 20 * ms, 10 * ms}
	stream := []time.Duration{8 * ms, 4 * ms, 30 * ms}
	// Fastest peer per batch: 5, 4, 10 -> ratios 0.5, 0.4, 1.
	got := pairedRatios(ours, writers, stream)
	want := RatioSpread{Median: 0.5, Min: 0.4, Max: 1, Batches: 3}
	if got == nil || *got != want {
		t.Fatalf("pairedRatios = %+v, want %+v", got, want)
	}
}

func TestPairedRatiosSkipsUnmeasuredBatches(t *testing.T) {
	ms := time.Millisecond
	// The third batch has no peer time and the second a zero one: one ratio is left.
	got := pairedRatios([]time.Duration{2 * ms, 2 * ms, 2 * ms}, []time.Duration{4 * ms, 0})
	want := RatioSpread{Median: 2, Min: 2, Max: 2, Batches: 1}
	if got == nil || *got != want {
		t.Fatalf("pairedRatios = %+v, want %+v", got, want)
	}
	if s := pairedRatios(nil, []time.Duration{ms}); s != nil {
		t.Fatalf("pairedRatios of no batches = %+v, want nil", s)
	}
	if s := pairedRatios([]time.Duration{ms}); s != nil {
		t.Fatalf("pairedRatios with no peer = %+v, want nil", s)
	}
}

func TestReportShowsRatioMedianAndRange(t *testing.T) {
	rep := &Report{Backend: "file", PutGBps: 1, GetGBps: 2, PeerPutGBps: 1, PeerGetGBps: 2, PutRatio: 0.9, GetRatio: 1,
		PutRatioBatches: &RatioSpread{Median: 0.9, Min: 0.81, Max: 0.97, Batches: 4}}
	var b strings.Builder
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "0.90x (0.81-0.97)") {
		t.Fatalf("table lacks the put ratio's median and range:\n%s", b.String())
	}
	// A report without batch ratios shows its one ratio.
	if !strings.Contains(b.String(), "1.00x") {
		t.Fatalf("table lacks the get ratio:\n%s", b.String())
	}
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"put_ratio_batches":{"median":0.9,"min":0.81,"max":0.97,"batches":4}`) {
		t.Fatalf("JSON lacks put_ratio_batches: %s", data)
	}
}
