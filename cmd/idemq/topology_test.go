package main

import (
	"cmp"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/topology"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTopologyApply(t *testing.T) {
	url := testenv.RequireAMQP(t)
	ex, q := testenv.Name(t, "x"), testenv.Name(t, "q")
	t.Cleanup(func() {
		testenv.DeleteQueue(q, q+".dlq", q+".retry.100", q+".retry.2000")
		_ = testenv.Channel(t).ExchangeDelete(ex, false, false)
	})
	yaml := `
exchanges:
  - name: ` + ex + `
    type: topic
queues:
  - name: ` + q + `
    type: quorum
    delivery_limit: 5
    retry_delays: [100ms, 2s]
bindings:
  - exchange: ` + ex + `
    queue: ` + q + `
    routing_key: order.*
`
	file := writeFile(t, yaml)
	names := map[string]string{ex: "EXCHANGE", q: "QUEUE"}
	golden(t, "topology_apply_dry_run_json", mustRun(t, "", "topology", "apply", "-f", file, "--dry-run", "-o", "json"), names)
	first := mustRun(t, "", "topology", "apply", "-f", file, "--url", url)
	golden(t, "topology_apply", first, names)
	if again := mustRun(t, "", "topology", "apply", "-f", file, "--url", url); again != first {
		t.Fatalf("second apply differs:\n%s", again)
	}
	for _, name := range []string{q + ".dlq", q + ".retry.100", q + ".retry.2000"} {
		testenv.QueueCounts(t, name) // fails the test if missing
	}

	// The same queue with another delivery limit: a typed error naming both.
	bad := writeFile(t, strings.Replace(yaml, "delivery_limit: 5", "delivery_limit: 9", 1))
	_, _, err := runCLI(t, "", "topology", "apply", "-f", bad, "--url", url)
	var me *topology.MismatchError
	if !errors.As(err, &me) || me.Name != q || me.Argument != "x-delivery-limit" {
		t.Fatalf("err %v, want a mismatch on %s x-delivery-limit", err, q)
	}
	if !strings.Contains(err.Error(), "asked for 9") {
		t.Fatalf("error does not say what was asked: %v", err)
	}

	if _, _, err := runCLI(t, "", "topology", "apply"); err == nil || !strings.Contains(err.Error(), "-f FILE") {
		t.Fatalf("missing -f: %v", err)
	}
}

func TestPasswordsAreRedacted(t *testing.T) {
	out, errOut, err := runCLI(t, "", "dlq", "list", "orders", "--url", "amqp://admin:s3cr3t-pw@127.0.0.1:1/")
	if err == nil {
		t.Fatal("expected a connection error")
	}
	for _, s := range []string{out, errOut, err.Error()} {
		if strings.Contains(s, "s3cr3t-pw") {
			t.Fatalf("password printed: %q", s)
		}
	}
	if !strings.Contains(err.Error(), "admin:xxxxx@127.0.0.1:1") {
		t.Fatalf("error should name the redacted URL: %v", err)
	}
	_, _, err = runCLI(t, "", "keys", "get", "x", "--group", "g", "--redis-url", "redis://:hunter2@127.0.0.1:1/0")
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("keys error %v", err)
	}
}

// The retry queues' lines say what kind of queue they are: quorum with
// at-least-once dead-lettering (and the reject-publish overflow it needs),
// or classic, at most once through a broker restart.
func TestDescribeTopologyShowsRetryQueueType(t *testing.T) {
	tests := []struct {
		name      string
		retryType topology.QueueType
		route     topology.RetryRoute
		want      []string
		strategy  string
		overflow  string
	}{
		{"default", "", "", []string{"quorum", "released by the consumers after 1s -> q1"}, "", ""},
		{"classic released", topology.Classic, topology.RouteRelease, []string{"classic", "released by the consumers after 1s -> q1"}, "", ""},
		{"dead-letter", "", topology.RouteDeadLetter, []string{"quorum", "dead-letter at-least-once", "overflow reject-publish", "ttl 1s -> q1"}, "at-least-once", "reject-publish"},
		{"quorum dead-letter", topology.Quorum, topology.RouteDeadLetter, []string{"quorum", "dead-letter at-least-once", "overflow reject-publish"}, "at-least-once", "reject-publish"},
		{"classic dead-letter", topology.Classic, topology.RouteDeadLetter, []string{"classic", "dead-letter at-most-once", "ttl 1s -> q1"}, "at-most-once", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := describeTopology(topology.Topology{Queues: []topology.Queue{
				{Name: "q1", RetryType: tt.retryType, RetryRoute: tt.route, RetryDelays: []time.Duration{time.Second}},
			}})
			var retry *appliedObject
			for i := range objs {
				if objs[i].Kind == "retry" {
					retry = &objs[i]
				}
			}
			if retry == nil {
				t.Fatalf("no retry line in %+v", objs)
			}
			for _, w := range tt.want {
				if !strings.Contains(retry.Info, w) {
					t.Errorf("retry line %q lacks %q", retry.Info, w)
				}
			}
			if want := cmp.Or(tt.route, topology.RouteRelease); retry.Route != string(want) {
				t.Errorf("JSON field route %q, want %q", retry.Route, want)
			}
			if retry.DeadLetterStrategy != tt.strategy || retry.Overflow != tt.overflow {
				t.Errorf("JSON fields: dead_letter_strategy %q overflow %q, want %q %q", retry.DeadLetterStrategy, retry.Overflow, tt.strategy, tt.overflow)
			}
		})
	}
}

// TestTopologyApplyWarnsOfClassicRetryOnQuorum: the combination that loses
// deliveries in a broker restart is declared (it may exist already) but
// named on stderr and in the JSON output.
func TestTopologyApplyWarnsOfClassicRetryOnQuorum(t *testing.T) {
	file := writeFile(t, "queues:\n  - name: orders\n    type: quorum\n    retry_type: classic\n    retry_route: dead-letter\n")
	out, errOut, err := runCLI(t, "", "topology", "apply", "-f", file, "--dry-run")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errOut, `warning: queue "orders": classic retry queues with a quorum work queue`) {
		t.Fatalf("no warning on stderr:\n%s", errOut)
	}
	if !strings.Contains(out, "would declare") {
		t.Fatalf("declaration plan missing:\n%s", out)
	}
	js, _, err := runCLI(t, "", "topology", "apply", "-f", file, "--dry-run", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js, `"warnings"`) || !strings.Contains(js, "retry_type: quorum") {
		t.Fatalf("JSON output has no warnings:\n%s", js)
	}
	for _, y := range []string{"queues:\n  - name: orders\n    type: quorum\n", "queues:\n  - name: orders\n    type: quorum\n    retry_type: classic\n"} {
		quiet := writeFile(t, y)
		if _, errOut, err := runCLI(t, "", "topology", "apply", "-f", quiet, "--dry-run"); err != nil || errOut != "" {
			t.Fatalf("released retry queues (%q): err %v, stderr %q", y, err, errOut)
		}
	}
}
