package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
)

// The restart experiment: the bench runs its node service as a child
// `strata serve` (this test binary), restarts it inside the strata run, and
// reports the L3 hits with the restart over those without. Every page the
// engines are served through the outage is verified; the engines must resume
// hitting the restarted service.
func TestBenchRestartNode(t *testing.T) {
	t.Setenv("STRATA_TEST_AS_MAIN", "1") // the node service and the engines are this binary
	for _, tc := range []struct {
		mode    string
		engines string
		warm    bool
	}{
		{"kill", "2", true},
		{"cold", "1", false},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			jsonPath := filepath.Join(shortDir(t), "r.json")
			code, out, errs := runCLI(t, "", "bench", "--runs", "strata", "--engines", tc.engines, "--node-arena", "64MiB",
				"--clients", "8", "--rounds", "5", "--request-tokens", "256", "--output-tokens", "16",
				"--l1-tokens", "2048", "--l2-ratio", "1", "--max-running", "4",
				"--restart-node", tc.mode, "--restart-at", "0.3", "--json", jsonPath)
			if code != 0 {
				t.Fatalf("exit %d: %s\n%s", code, errs, out)
			}
			m := regexp.MustCompile(`L3 hit tokens with restart / without = (\d+\.\d\d) \(goal ≥ 0\.8\)`).FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("no ratio line in the report:\n%s", out)
			}
			raw, err := os.ReadFile(jsonPath)
			if err != nil {
				t.Fatal(err)
			}
			var rep struct {
				Runs []struct {
					Name         string `json:"name"`
					CorruptPages int64  `json:"corrupt_pages"`
					Verified     int64  `json:"verified_pages"`
					HitTokens    struct {
						L3 int64 `json:"l3"`
					} `json:"hit_tokens"`
					L3 *struct {
						Outage *struct {
							Disconnects  int64   `json:"disconnects"`
							Reconnects   int64   `json:"reconnects"`
							RefusedCalls int64   `json:"refused_calls"`
							LostCalls    int64   `json:"lost_calls"`
							Unreachable  float64 `json:"unreachable"`
						} `json:"outage"`
					} `json:"l3"`
					Warmup *struct {
						ArenaBytes int64   `json:"arena_bytes"`
						Took       float64 `json:"took"`
					} `json:"warmup"`
				} `json:"runs"`
				Restart *struct {
					Mode        string  `json:"mode"`
					Run         string  `json:"run"`
					Restarted   int     `json:"restarted"`
					Down        float64 `json:"down"`
					Warm        bool    `json:"warm"`
					Recovered   int64   `json:"recovered"`
					Before      int64   `json:"objects_before"`
					L3          int64   `json:"l3_hit_tokens"`
					Baseline    int64   `json:"baseline_l3_hit_tokens"`
					After       int64   `json:"after_l3_hit_tokens"`
					BackAt      float64 `json:"back_at"`
					BaseAfter   int64   `json:"baseline_after_l3_hit_tokens"`
					AfterRatio  float64 `json:"after_ratio"`
					Ratio       float64 `json:"ratio"`
					Refills     int64   `json:"refills"`
					RefillPages int64   `json:"refill_pages"`
				} `json:"restart"`
			}
			if err := json.Unmarshal(raw, &rep); err != nil {
				t.Fatal(err)
			}
			rs := rep.Restart
			if rs == nil || len(rep.Runs) != 2 || rep.Runs[0].Name != "strata" || rep.Runs[1].Name != "strata-"+tc.mode || rs.Run != rep.Runs[1].Name {
				t.Fatalf("want runs strata and strata-%s and a restart section: %s", tc.mode, raw)
			}
			for _, r := range rep.Runs {
				if r.CorruptPages != 0 || r.Verified == 0 {
					t.Fatalf("run %s: %d corrupt of %d verified pages", r.Name, r.CorruptPages, r.Verified)
				}
				// Each run began on a ready service, its warm-up reported.
				if r.Warmup == nil || r.Warmup.ArenaBytes != 64<<20 || r.Warmup.Took <= 0 {
					t.Fatalf("run %s: warm-up %+v", r.Name, r.Warmup)
				}
			}
			// The engines saw the service go and come back: the outage is
			// counted, in the JSON and on a line of its own, whatever the
			// cache's faults say.
			if l3 := rep.Runs[1].L3; l3 == nil || l3.Outage == nil || l3.Outage.Disconnects == 0 || l3.Outage.Reconnects == 0 ||
				l3.Outage.Unreachable <= 0 {
				t.Fatalf("run %s: L3 outage %+v", rep.Runs[1].Name, l3)
			}
			if o := rep.Runs[0].L3.Outage; o == nil || o.Disconnects != 0 || o.Unreachable != 0 {
				t.Fatalf("the run without a restart saw an outage: %+v", o)
			}
			if !regexp.MustCompile(`(?m)^strata-` + tc.mode + `: L3 outage: the node service was unreachable for \d+\.\d ms[^;]*; \d+ connections? lost, \d+ reconnects?`).MatchString(out) {
				t.Fatalf("no outage line for the restarted run:\n%s", out)
			}
			if rs.Mode != tc.mode || rs.Restarted != 1 || rs.Down <= 0 {
				t.Fatalf("restart %+v", *rs)
			}
			// The engines hit the restarted service: what it recovered (kill), or
			// what they refilled it with from L2 (cold).
			if rs.After <= 0 {
				t.Fatalf("no L3 hits after the restart: %+v\n%s", *rs, out)
			}
			// The same part of the baseline run, for the hits after the restart.
			if rs.BackAt <= 0 || rs.BaseAfter <= 0 || math.Abs(rs.AfterRatio-float64(rs.After)/float64(rs.BaseAfter)) > 1e-9 {
				t.Fatalf("hits after the restart %d, baseline's from %vs on %d, ratio %v", rs.After, rs.BackAt, rs.BaseAfter, rs.AfterRatio)
			}
			if rs.L3 != rep.Runs[1].HitTokens.L3 || rs.Baseline != rep.Runs[0].HitTokens.L3 || rs.Baseline == 0 ||
				math.Abs(rs.Ratio-float64(rs.L3)/float64(rs.Baseline)) > 1e-9 {
				t.Fatalf("ratio %v of %d over %d", rs.Ratio, rs.L3, rs.Baseline)
			}
			if printed, _ := strconv.ParseFloat(m[1], 64); math.Abs(printed-rs.Ratio) > 0.0051 {
				t.Fatalf("printed ratio %s, report's %v", m[1], rs.Ratio)
			}
			if rs.Warm != tc.warm {
				t.Fatalf("restarted service warm=%v, want %v: %+v", rs.Warm, tc.warm, *rs)
			}
			if tc.warm && (rs.Before == 0 || rs.Recovered == 0) {
				t.Fatalf("warm restart recovered %d of %d objects", rs.Recovered, rs.Before)
			}
			if !tc.warm && (rs.Recovered != 0 || rs.Refills == 0 || rs.RefillPages == 0) {
				t.Fatalf("cold restart: %d recovered, %d refills of %d pages", rs.Recovered, rs.Refills, rs.RefillPages)
			}
		})
	}
}
