package main

import (
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/topology"
)

// A missing-id dead letter carries a synthetic UUID: replay warns and
// leaves it unless --allow-synthetic-id (before: replayed silently).
func TestDLQReplayMissingIDNeedsFlag(t *testing.T) {
	url := testenv.RequireAMQP(t)
	p := declareQueue(t, topology.Queue{Name: testenv.Name(t, "q"), NoRetry: true})
	synth := idemq.NewMessageID()
	testenv.Publish(t, "", p.DLQ,
		forged(synth, "", p.Queue, amqp.Table{idemq.HeaderQueue: p.Queue, idemq.HeaderReason: idemq.ReasonMissingID}),
		forged("order-1", "", p.Queue, amqp.Table{idemq.HeaderQueue: p.Queue}))

	out, _, err := runCLI(t, "", "dlq", "replay", p.Queue, "--url", url)
	if err == nil {
		t.Fatalf("replay of a missing-id dead letter without the flag succeeded:\n%s", out)
	}
	if !strings.Contains(out, "--allow-synthetic-id") || !strings.Contains(out, "replayed 1,") {
		t.Fatalf("replay output does not warn or did not replay the other letter:\n%s", out)
	}
	testenv.Eventually(t, wait, "order-1 replayed, the synthetic one left", func() bool {
		return count(t, p.Queue) == 1 && count(t, p.DLQ) == 1
	})
	out = mustRun(t, "", "dlq", "replay", p.Queue, "--url", url, "--allow-synthetic-id")
	if !strings.Contains(out, "replayed 1,") || !strings.Contains(out, synth) {
		t.Fatalf("replay with --allow-synthetic-id:\n%s", out)
	}
	testenv.Eventually(t, wait, "the synthetic one replayed", func() bool { return count(t, p.Queue) == 2 && count(t, p.DLQ) == 0 })
}
