package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
