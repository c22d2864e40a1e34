package main

import (
	"encoding/json"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// deploy/prometheus/strata.yml, the scrape config for a Prometheus beside the
// service, run by a real Prometheus against a real `strata serve`: it scrapes
// the service, names the instance as the config says, and every query of the
// Grafana dashboard returns series from what it scraped.

const scrapeConfigPath = deployDir + "/prometheus/strata.yml"

// promQueryResult is the part of Prometheus's /api/v1/query answer the test reads.
type promQueryResult struct {
	Status string `json:"status"`
	Error  string `json:"error"`
	Data   struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
			Value  []any             `json:"value"`
		} `json:"result"`
	} `json:"data"`
}

func promQuery(t *testing.T, addr, q string) promQueryResult {
	t.Helper()
	var r promQueryResult
	body := httpGet(t, "http://"+addr+"/api/v1/query?query="+url.QueryEscape(q))
	if err := json.Unmarshal(body, &r); err != nil || r.Status != "success" {
		t.Fatalf("query %s: %v %s: %s", q, err, r.Error, body)
	}
	return r
}

func TestDeployPrometheusScrapesTheService(t *testing.T) {
	promtool := requireTool(t, "promtool", "prometheus")
	prometheus := requireTool(t, "prometheus", "prometheus")
	if out, err := exec.Command(promtool, "check", "config", scrapeConfigPath).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
	raw, err := os.ReadFile(scrapeConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	example := loadServeConfig(t, []string{"--config", exampleConfig})
	svc := startMetricsService(t)
	cfg := string(raw)
	// The shipped config, with the test service's admin port for serve.json's
	// and a scrape a second, so that rates have samples within seconds.
	for old, repl := range map[string]string{`"` + example.Admin + `"`: `"` + svc.admin + `"`, "scrape_interval: 15s": "scrape_interval: 1s"} {
		if !strings.Contains(cfg, old) {
			t.Fatalf("%s does not hold %s (serve.json's admin address, and the scrape interval)", scrapeConfigPath, old)
		}
		cfg = strings.ReplaceAll(cfg, old, repl)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "strata.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	web := ln.Addr().String()
	ln.Close()
	log := &syncBuffer{}
	cmd := exec.Command(prometheus, "--config.file="+filepath.Join(dir, "strata.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+web, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	// Gets keep coming while Prometheus scrapes and the dashboard's queries
	// run, so that the rates over the last seconds are of traffic.
	stop, traffic := make(chan struct{}), make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				traffic <- nil
				return
			case <-time.After(50 * time.Millisecond):
			}
			if err := svc.get(); err != nil {
				traffic <- err
				return
			}
		}
	}()
	defer func() {
		close(stop)
		if err := <-traffic; err != nil {
			t.Errorf("gets during the scrapes: %v", err)
		}
	}()

	// Up, scraped at least five times (a rate over 5s has samples).
	deadline := time.Now().Add(90 * time.Second)
	for {
		select {
		case err := <-exited:
			t.Fatalf("prometheus exited: %v\n%s", err, log.String())
		default:
		}
		if ready, err := promReady(web); ready {
			r := promQuery(t, web, `count_over_time(up{job="strata"}[1m]) >= 5 and up{job="strata"} == 1`)
			if len(r.Data.Result) == 1 {
				if got := r.Data.Result[0].Metric["instance"]; got != "strata-node-1" {
					t.Fatalf("instance %q, want the config's strata-node-1", got)
				}
				break
			}
		} else if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready within 90 s: %v\n%s", err, log.String())
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus did not scrape the service 5 times within 90 s:\n%s", log.String())
		}
		time.Sleep(200 * time.Millisecond)
	}

	vars := strings.NewReplacer("$__rate_interval", "5s", "$instance", ".*")
	for _, e := range dashboardExprs(t) {
		r := promQuery(t, web, vars.Replace(e))
		// A "> 0" filter leaves out what did not happen (no errors here). A
		// ratio of rates is NaN only over a window without traffic.
		if len(r.Data.Result) == 0 && !strings.HasSuffix(e, "> 0") {
			t.Errorf("%s: no series from a Prometheus that scrapes the service", e)
		}
		for _, s := range r.Data.Result {
			if len(s.Value) == 2 {
				if v, ok := s.Value[1].(string); ok {
					if f, err := strconv.ParseFloat(v, 64); err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
						t.Errorf("%s: %v is %q", e, s.Metric, v)
					}
				}
			}
		}
	}
}

// promReady reports whether the Prometheus at addr says it is ready.
func promReady(addr string) (bool, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/-/ready")
	if err != nil {
		return false, err
	}
	resp.Body.Close()
	return resp.StatusCode == 200, nil
}
