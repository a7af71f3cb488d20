package metrics_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/metrics"
)

// startPrometheus runs a private Prometheus (Debian's package, installed
// by scripts/services.sh) scraping target every second, and returns its
// base URL. With CI=true a missing binary fails the test.
func startPrometheus(t *testing.T, target string) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		if testenv.InCI() {
			t.Fatalf("prometheus not installed (scripts/services.sh installs it): %v", err)
		}
		t.Skipf("prometheus not installed: %v", err)
	}
	dir := t.TempDir()
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: idemq\n    static_configs:\n      - targets: [%q]\n", target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--log.level=warn")
	out, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Logf("prometheus log:\n%s", b)
		}
	})
	return "http://" + addr
}

// promQuery returns the single value of an instant query, or ok=false.
func promQuery(base, q string) (float64, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/query?query="+url.QueryEscape(q), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	var r struct {
		Status string
		Data   struct {
			Result []struct {
				Value [2]any
			}
		}
	}
	if json.NewDecoder(resp.Body).Decode(&r) != nil || r.Status != "success" || len(r.Data.Result) != 1 {
		return 0, false
	}
	s, _ := r.Data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	return v, err == nil
}

// A real Prometheus scrapes a consumer's /metrics during a run with
// duplicates and failing messages; its query API returns what the test
// published.
func TestPrometheusScrapesConsumer(t *testing.T) {
	m, err := metrics.New(metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: metrics.NewHealth(metrics.HealthConfig{Gatherer: m.Gatherer()}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	prom := startPrometheus(t, ln.Addr().String())

	const good, resends, bad = 30, 7, 3
	s := runScenario(t, m, good, resends, bad)
	sel := fmt.Sprintf(`queue=%q,group=%q`, s.queue, s.group)
	for _, c := range []struct {
		query string
		want  float64
	}{
		{`sum(idemq_deliveries_total{` + sel + `,outcome="processed"})`, good},
		{`sum(idemq_duplicates_total{` + sel + `,layer="guard"})`, resends},
		{`sum(idemq_dead_lettered_total{` + sel + `,reason="` + idemq.ReasonMaxAttempts + `"})`, bad},
		{`sum(idemq_received_total{` + sel + `})`, good + resends + bad},
		{`sum(idemq_handler_duration_seconds_count{` + sel + `})`, good + resends + bad},
	} {
		var got float64
		var ok bool
		deadline := time.Now().Add(2 * time.Minute)
		for {
			got, ok = promQuery(prom, c.query)
			if ok && got == c.want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("prometheus: %s = %v (ok=%v), want %v", c.query, got, ok, c.want)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
}
