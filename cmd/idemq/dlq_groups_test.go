package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/deadletter"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/topology"
)

// TestDLQGroupsAndGroupReplay: `dlq groups` groups by reason and normalised
// error (duplicates once); `dlq replay --group` sends that group, and only
// it, to the work queue.
func TestDLQGroupsAndGroupReplay(t *testing.T) {
	url := testenv.RequireAMQP(t)
	p := declareQueue(t, topology.Queue{Name: testenv.Name(t, "q"), NoRetry: true})
	var msgs []amqp.Publishing
	for i := range 6 {
		errText := fmt.Sprintf("order %d not found", 100+i)
		if i%2 == 1 {
			errText = fmt.Sprintf("gateway 0x%x timeout", 4096+i)
		}
		m := deadLetter(fmt.Sprintf("g-%d", i), p.Queue)
		m.Headers[idemq.HeaderReason] = idemq.ReasonMaxAttempts
		m.Headers[idemq.HeaderError] = errText
		m.Headers[idemq.HeaderQueue] = p.Queue
		msgs = append(msgs, m)
	}
	msgs = append(msgs, msgs[0]) // a duplicate dead letter
	testenv.Publish(t, "", p.DLQ, msgs...)
	testenv.Eventually(t, wait, "7 dead letters", func() bool { return count(t, p.DLQ) == 7 })

	text := mustRun(t, "", "dlq", "groups", p.Queue, "--url", url)
	for _, want := range []string{"7 message(s), 2 group(s)", "3 (+1)", "order <n> not found", "gateway <hex> timeout"} {
		if !strings.Contains(text, want) {
			t.Fatalf("groups output lacks %q:\n%s", want, text)
		}
	}
	var js struct {
		Groups []deadletter.Group `json:"groups"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "", "dlq", "groups", p.Queue, "--url", url, "-o", "json")), &js); err != nil || len(js.Groups) != 2 {
		t.Fatalf("json groups %+v, %v", js, err)
	}
	var key string
	for _, g := range js.Groups {
		if g.Pattern == "order <n> not found" {
			key = g.Key
		}
	}
	out := mustRun(t, "", "dlq", "replay", p.Queue, "--url", url, "--group", key)
	if !strings.Contains(out, "replayed 3, duplicates dropped 1, skipped 3") {
		t.Fatalf("replay output %q", out)
	}
	var ids []string
	for _, d := range testenv.Drain(t, p.Queue) {
		ids = append(ids, d.MessageId)
	}
	sort.Strings(ids)
	if fmt.Sprint(ids) != "[g-0 g-2 g-4]" {
		t.Fatalf("work queue got %v", ids)
	}
	if n := count(t, p.DLQ); n != 3 {
		t.Fatalf("%d left in the DLQ, want 3", n)
	}
}
