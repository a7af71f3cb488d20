package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/idemq/idemq/internal/testenv"
)

// idemq doctor prints each finding with its meaning and fix, and exits
// non-zero on a FAIL; --output json carries the same findings.
func TestDoctorCommand(t *testing.T) {
	rs := testenv.StartPrivateRedis(t, true)
	file := writeFile(t, "queues:\n  - name: doctor.cli\n    type: quorum\n    retry_delays: [1m, 1h]\n")

	// A window shorter than the retry horizon of the default delays
	// (12m36s + quick retries): FAIL, exit 1.
	out, _, err := runCLI(t, "", "doctor", "--dedup-window", "10m", "--redis-url", "redis://"+rs.Addr()+"/0")
	if !errors.Is(err, errDoctorFailed) {
		t.Fatalf("err %v, want errDoctorFailed\n%s", err, out)
	}
	for _, want := range []string{"FAIL  horizon.dedup-window", "fix: set dedup.Config.Window", "PASS  redis.maxmemory-policy", "1 fail"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// The topology's horizon (1m + 1h) and the retention covered; the
	// broker unreachable: that FAILs.
	out, _, err = runCLI(t, "", "doctor", "-f", file, "--url", "amqp://guest:guest@127.0.0.1:1/", "--dedup-window", "24h",
		"--dead-letter-retention", "12h", "--output", "json", "--redis-url", "redis://"+rs.Addr()+"/0")
	if !errors.Is(err, errDoctorFailed) {
		t.Fatalf("err %v, want errDoctorFailed\n%s", err, out)
	}
	var res struct {
		Findings []struct{ Check, Status string }
		Worst    string
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	var checks []string
	for _, f := range res.Findings {
		checks = append(checks, f.Check+"="+f.Status)
	}
	got := strings.Join(checks, " ")
	for _, want := range []string{"horizon.dedup-window=PASS", "redis.persistence=PASS", "broker.reach=FAIL"} {
		if !strings.Contains(got, want) {
			t.Errorf("findings %s lack %s", got, want)
		}
	}

	if _, _, err := runCLI(t, "", "doctor"); err == nil || !strings.Contains(err.Error(), "nothing to check") {
		t.Errorf("doctor without anything to check: %v", err)
	}
}
