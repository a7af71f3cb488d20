package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/idemq/idemq/internal/testenv"
)

// topology inspect shows the limit a policy sets, which AMQP cannot show,
// warns when it is below the declared one, and never prints the password.
func TestTopologyInspect(t *testing.T) {
	mu := testenv.RequireManagement(t)
	url := testenv.RequireAMQP(t)
	qq, cq := testenv.Name(t, "qq"), testenv.Name(t, "cq")
	t.Cleanup(func() {
		testenv.DeleteQueue(qq, qq+".dlq", qq+".retry.100", cq, cq+".dlq", cq+".retry.100")
	})
	testenv.SetPolicy(t, false, qq+"-dl", "^"+regexp.QuoteMeta(qq)+"$", `{"delivery-limit":4}`, 100)
	file := writeFile(t, `
queues:
  - name: `+qq+`
    type: quorum
    retry_delays: [100ms]
  - name: `+cq+`
    type: classic
    retry_delays: [100ms]
`)
	// Without a management URL: the declared limit only.
	t.Setenv(envManagementURL, "")
	out := mustRun(t, "", "topology", "inspect", "-f", file)
	if !strings.Contains(out, "queue "+qq+": quorum, declared delivery limit 20, broker: not read (no --management-url)") {
		t.Fatalf("without a management URL:\n%s", out)
	}
	mustRun(t, "", "topology", "apply", "-f", file, "--url", url)
	out, errOut, err := runCLI(t, "", "topology", "inspect", "-f", file, "--url", url, "--management-url", mu)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	want := "queue " + qq + ": quorum, declared delivery limit 20, broker: 4 (policy " + qq + "-dl), in-place requeues republished from x-delivery-count 2"
	if !strings.Contains(out, want) || !strings.Contains(out, "queue "+cq+": classic, declared delivery limit none, broker: none (classic queue)") {
		t.Fatalf("got\n%s\nwant a line\n%s", out, want)
	}
	if !strings.Contains(errOut, "warning: queue "+qq+": the broker applies a delivery limit of 4 (policy") {
		t.Fatalf("no warning for a broker limit below the declared one:\n%s", errOut)
	}
	js := mustRun(t, "", "topology", "inspect", "-f", file, "--url", url, "--management-url", mu, "-o", "json")
	var res struct {
		Queues []inspectedQueue `json:"queues"`
	}
	if err := json.Unmarshal([]byte(js), &res); err != nil || len(res.Queues) != 2 {
		t.Fatalf("json %v:\n%s", err, js)
	}
	if q := res.Queues[0]; q.BrokerLimit == nil || *q.BrokerLimit != 4 || q.Source != "policy" || q.RepublishFrom != 2 {
		t.Fatalf("json queue %+v", q)
	}

	// A wrong password: an error that does not show it.
	_, errOut, err = runCLI(t, "", "topology", "inspect", "-f", file, "--management-url", "http://guest:s3cret-wrong@"+strings.SplitN(mu, "@", 2)[1])
	if err == nil || strings.Contains(err.Error()+errOut, "s3cret-wrong") || !strings.Contains(err.Error(), "401") {
		t.Fatalf("wrong password: %v\n%s", err, errOut)
	}
}
