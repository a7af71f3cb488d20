package metrics_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/metrics"
)

// recordingRegisterer keeps the collectors registered.
type recordingRegisterer struct {
	prometheus.Registerer
	cs []prometheus.Collector
}

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	r.cs = append(r.cs, c)
	return r.Registerer.Register(c)
}

var (
	fqNameRe = regexp.MustCompile(`fqName: "([a-zA-Z_:][a-zA-Z0-9_:]*)"`)
	idemqRe  = regexp.MustCompile(`\bidemq_[a-z0-9_]+`)
)

// metricNames returns every metric name the package defines.
func metricNames(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	rr := &recordingRegisterer{Registerer: reg}
	if _, err := metrics.New(metrics.Config{Registerer: rr, Gatherer: reg}); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, c := range rr.cs {
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			if m := fqNameRe.FindStringSubmatch(d.String()); m != nil {
				names[m[1]] = true
			}
		}
	}
	return names
}

// checkNames fails for an idemq_ name in text that the package does not
// define (histogram series suffixes allowed).
func checkNames(t *testing.T, what, text string, names map[string]bool) {
	t.Helper()
	found := idemqRe.FindAllString(text, -1)
	if len(found) == 0 {
		t.Fatalf("%s names no idemq metric", what)
	}
	for _, n := range found {
		base := n
		for _, suf := range []string{"_bucket", "_count", "_sum"} {
			if b, ok := strings.CutSuffix(n, suf); ok && names[b] {
				base = b
			}
		}
		if !names[base] {
			t.Errorf("%s uses %s, which package metrics does not export", what, n)
		}
	}
}

func TestDashboardNamesExistingMetrics(t *testing.T) {
	names := metricNames(t)
	b, err := os.ReadFile("../deploy/grafana/idemq-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if len(dash.Panels) == 0 {
		t.Fatal("dashboard has no panels")
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			checkNames(t, "panel "+p.Title, tg.Expr, names)
		}
	}
}

func TestAlertRules(t *testing.T) {
	const path = "../deploy/prometheus/idemq-alerts.yml"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	checkNames(t, path, string(b), metricNames(t))
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if testenv.InCI() {
			t.Fatalf("promtool not installed (scripts/services.sh installs prometheus): %v", err)
		}
		t.Skipf("promtool not installed: %v", err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}
