package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/stratakv/strata/internal/redistest"
)

// The service's /metrics, scraped from a real `strata serve` with a spill and
// a Redis write-through that has served puts, hits and misses: it passes
// `promtool check metrics`, and every metric and label the Grafana dashboard
// (deploy/grafana/strata.json) queries is one it exports, in expressions that
// Prometheus's own parser (`promtool check rules`) accepts.
//
// The SGLang plugin exports no metrics of its own: its get_stats hands SGLang
// the pages it prefetched and backed up (SGLang's StorageMetrics), which SGLang
// exports under its own names; the dashboard charts the service only.

const dashboardPath = deployDir + "/grafana/strata.json"

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = map[string]bool{"instance": true, "job": true}

// metricsService is a `strata serve` with a spill and a real redis-server to
// write through to, and a client that put objects into it.
type metricsService struct {
	admin string
	c     *restartClient
	keys  []string
	sizes []int
}

// startMetricsService starts the service, puts objects, and gets them back
// with one key it does not have, so that every counter has counted.
func startMetricsService(t *testing.T) *metricsService {
	t.Helper()
	redis := redistest.Start(t)
	dir := shortDir(t)
	socket := filepath.Join(dir, "s")
	s := spawnServe(t, socket, "--arena", "64MiB", "--admin", "127.0.0.1:0", "--arena-file", "",
		"--spill-dir", filepath.Join(dir, "spill"), "--remote", redis.Addr(), "--log-level", "warn")
	st := waitAnswers(t, s, socket)
	if st.Admin == "" {
		t.Fatalf("the service reports no admin address; log:\n%s", s.log.String())
	}
	m := &metricsService{admin: st.Admin, c: newRestartClient(t, socket, "metrics"), keys: []string{"m0", "m1", "m2", "m3", "m4"}}
	for i := range m.keys {
		m.sizes = append(m.sizes, objSize(i))
	}
	acked, err := m.c.put(m.keys, m.sizes)
	if err != nil || len(acked) != len(m.keys) {
		t.Fatalf("put: %v, %d of %d acknowledged", err, len(acked), len(m.keys))
	}
	if err := m.get(); err != nil {
		t.Fatal(err)
	}
	return m
}

// get reads every object put and one absent key in one batch: a batch of
// hits and a miss.
func (m *metricsService) get() error {
	found, wrong, err := m.c.get(append(m.keys, "absent"), append(m.sizes, 4096))
	if err != nil || len(wrong) > 0 {
		return fmt.Errorf("get: %v, wrong bytes in %q", err, wrong)
	}
	for i, f := range found {
		if f != (i < len(m.keys)) {
			return fmt.Errorf("get: found %v, want the %d objects put and not the absent one", found, len(m.keys))
		}
	}
	return nil
}

// httpGet fetches url within 10 s.
func httpGet(t *testing.T, url string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v\n%s", url, resp.Status, err, body)
	}
	return body
}

func TestDeployMetrics(t *testing.T) {
	body := httpGet(t, "http://"+startMetricsService(t).admin+"/metrics")
	t.Run("promtool", func(t *testing.T) {
		promtool := requireTool(t, "promtool", "prometheus")
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = bytes.NewReader(body)
		if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Fatalf("promtool check metrics: %v\n%s", err, out)
		}
	})
	t.Run("dashboard", func(t *testing.T) {
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
		if err != nil {
			t.Fatalf("parsing /metrics: %v", err)
		}
		exprs := dashboardExprs(t)
		used := map[string]bool{}
		for _, e := range exprs {
			for _, name := range checkExpr(t, e, families) {
				used[name] = true
			}
		}
		var unused []string
		for name := range families {
			if strings.HasPrefix(name, "strata_") && !used[name] {
				unused = append(unused, name)
			}
		}
		sort.Strings(unused)
		t.Logf("%d queries use %d of the %d metrics /metrics exports; not charted: %q", len(exprs), len(used), len(families), unused)
		checkRulesParse(t, exprs)
	})
}

// dashboardExprs is every PromQL expression in the dashboard: its panels'
// targets and its template variables' queries.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	var exprs []string
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable %s: %v", v.Name, err)
		}
		// label_values(metric, label): the metric is queried, the label must be on it.
		inner, ok := strings.CutPrefix(q.Query, "label_values(")
		metric, label, ok2 := strings.Cut(strings.TrimSuffix(inner, ")"), ",")
		if !ok || !ok2 {
			t.Fatalf("variable %s: query %q is not label_values(metric, label)", v.Name, q.Query)
		}
		exprs = append(exprs, fmt.Sprintf("count by (%s) (%s)", strings.TrimSpace(label), strings.TrimSpace(metric)))
	}
	if len(exprs) == 0 {
		t.Fatalf("%s holds no queries", dashboardPath)
	}
	return exprs
}

// checkExpr checks that every metric expr selects is exported, that every
// label it matches or groups by is on those metrics (or is a target label),
// and that every value it matches with = is one of the label's values. It
// returns the metric names.
func checkExpr(t *testing.T, expr string, families map[string]*dto.MetricFamily) []string {
	t.Helper()
	sels, grouping, err := promqlRefs(expr)
	if err != nil {
		t.Errorf("%s: %v", expr, err)
		return nil
	}
	if len(sels) == 0 {
		t.Errorf("%s selects no metric", expr)
	}
	labels := map[string]map[string]bool{} // label: values, over the metrics expr selects
	var names []string
	for _, sel := range sels {
		f, ok := families[sel.name]
		if !ok {
			t.Errorf("%s: %s is not a metric /metrics exports", expr, sel.name)
			continue
		}
		names = append(names, sel.name)
		own := map[string]map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if own[lp.GetName()] == nil {
					own[lp.GetName()] = map[string]bool{}
				}
				own[lp.GetName()][lp.GetValue()] = true
			}
		}
		for _, m := range sel.matchers {
			switch {
			case targetLabels[m.label]:
			case own[m.label] == nil:
				t.Errorf("%s: %s has no label %q", expr, sel.name, m.label)
			case m.op == "=" && !own[m.label][m.value]:
				t.Errorf("%s: %s{%s} has no series with %s=%q", expr, sel.name, m.label, m.label, m.value)
			}
		}
		for l, vs := range own {
			labels[l] = vs
		}
	}
	for _, l := range grouping {
		if !targetLabels[l] && labels[l] == nil {
			t.Errorf("%s: groups by %q, a label none of its metrics has", expr, l)
		}
	}
	return names
}

// grafanaVars replaces the dashboard's variables as Grafana does before it
// sends a query: a rate interval, and every instance.
var grafanaVars = strings.NewReplacer("$__rate_interval", "1m", "$instance", ".*")

// checkRulesParse hands every expression (Grafana's variables replaced as
// Grafana does before it sends a query) to Prometheus's own parser, as
// recording rules for `promtool check rules`.
func checkRulesParse(t *testing.T, exprs []string) {
	t.Helper()
	promtool := requireTool(t, "promtool", "prometheus")
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	rules := make([]rule, len(exprs))
	for i, e := range exprs {
		rules[i] = rule{Record: fmt.Sprintf("strata:dashboard_query_%d", i), Expr: grafanaVars.Replace(e)}
	}
	doc, err := json.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yml") // YAML: JSON is YAML
	if err := os.WriteFile(path, doc, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
	}
}

// The hit ratio panel's query, evaluated by Prometheus's own engine (promtool
// test rules) on series like the service's: one instance with a Redis (whose
// hits count as hits) and one without (which exports no Redis metrics, and
// must still get a ratio).
func TestDeployDashboardHitRatio(t *testing.T) {
	promtool := requireTool(t, "promtool", "prometheus")
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	expr := ""
	for _, p := range d.Panels {
		if p.Title == "Get hit ratio" && len(p.Targets) == 1 {
			expr = grafanaVars.Replace(p.Targets[0].Expr)
		}
	}
	if expr == "" {
		t.Fatalf("%s has no panel \"Get hit ratio\" with one query", dashboardPath)
	}
	// Every series grows by 60 a minute: 1 a second.
	series := func(s string) map[string]string { return map[string]string{"series": s, "values": "0+60x10"} }
	doc := map[string]any{
		"rule_files":          []string{"none.yml"},
		"evaluation_interval": "1m",
		"tests": []any{map[string]any{
			"interval": "1m",
			"input_series": []any{
				series(`strata_node_objects_total{op="get",tier="arena",instance="a"}`),
				series(`strata_node_objects_total{op="get",tier="spill",instance="a"}`),
				series(`strata_node_objects_total{op="put",tier="arena",instance="a"}`),
				series(`strata_node_remote_gets_total{result="hit",instance="a"}`),
				series(`strata_node_remote_gets_total{result="miss",instance="a"}`),
				series(`strata_node_misses_total{instance="a"}`),
				series(`strata_node_objects_total{op="get",tier="arena",instance="b"}`),
				series(`strata_node_misses_total{instance="b"}`),
			},
			"promql_expr_test": []any{map[string]any{
				"expr":      expr,
				"eval_time": "5m",
				"exp_samples": []any{
					map[string]any{"labels": `{instance="a"}`, "value": 0.75}, // arena, spill, Redis hit; one miss
					map[string]any{"labels": `{instance="b"}`, "value": 0.5},
				},
			}},
		}},
	}
	dir := t.TempDir()
	for name, v := range map[string]any{"none.yml": map[string]any{"groups": []any{}}, "test.yml": doc} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(promtool, "test", "rules", "test.yml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules on %s: %v\n%s", expr, err, out)
	}
}
