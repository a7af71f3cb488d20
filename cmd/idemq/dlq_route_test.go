package main

import (
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/topology"
)

// forged is a dead letter whose headers name a route of the producer's
// choosing.
func forged(id, exchange, key string, extra amqp.Table) amqp.Publishing {
	h := amqp.Table{
		idemq.HeaderReason: idemq.ReasonPermanent, idemq.HeaderOriginalExchange: exchange,
		idemq.HeaderOriginalRoutingKey: key, idemq.HeaderAttempts: int64(1),
	}
	for k, v := range extra {
		h[k] = v
	}
	return amqp.Publishing{MessageId: id, Body: []byte(id), Headers: h}
}

// fanoutTo declares a fanout exchange bound to queues (deleted at cleanup).
func fanoutTo(t *testing.T, queues ...string) string {
	t.Helper()
	ch := testenv.Channel(t)
	x := testenv.Name(t, "fanout")
	if err := ch.ExchangeDeclare(x, "fanout", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if conn, err := amqp.Dial(testenv.AMQPURL()); err == nil {
			if c, err := conn.Channel(); err == nil {
				_ = c.ExchangeDelete(x, false, false)
			}
			conn.Close()
		}
	})
	for _, q := range queues {
		if err := ch.QueueBind(q, "", x, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	return x
}

// TestDLQReplayGoesToTheWorkQueueOnly: a dead letter whose headers name a
// fanout exchange (forged by a producer, or the real original route of a
// message many groups consume) is replayed to the failed work queue only,
// never to the exchange; the header route needs --to-original-route.
func TestDLQReplayGoesToTheWorkQueueOnly(t *testing.T) {
	url := testenv.RequireAMQP(t)
	p := declareQueue(t, topology.Queue{Name: testenv.Name(t, "q"), NoRetry: true})
	other := testenv.Queue(t, nil) // another consumer group's queue
	x := fanoutTo(t, p.Queue, other)
	testenv.Publish(t, "", p.DLQ, forged("evil-1", x, "", nil))

	out := mustRun(t, "", "dlq", "replay", p.Queue, "--url", url)
	if !strings.Contains(out, "replayed 1") {
		t.Fatalf("output %q", out)
	}
	testenv.Eventually(t, wait, "the replay in the work queue", func() bool { return count(t, p.Queue) == 1 })
	if n := count(t, other); n != 0 {
		t.Fatalf("the replay reached another group's queue through the header's exchange (%d message(s))", n)
	}
	got := testenv.Drain(t, p.Queue)
	if len(got) != 1 || got[0].Exchange != "" || got[0].RoutingKey != p.Queue {
		t.Fatalf("replayed through exchange %q, routing key %q; want the default exchange to %q", got[0].Exchange, got[0].RoutingKey, p.Queue)
	}

	// Explicitly: the original route from the headers.
	testenv.Publish(t, "", p.DLQ, forged("orig-1", x, "", nil))
	mustRun(t, "", "dlq", "replay", p.Queue, "--url", url, "--to-original-route")
	testenv.Eventually(t, wait, "the fanout delivered to both queues", func() bool {
		return count(t, p.Queue) == 1 && count(t, other) == 1
	})
	testenv.Drain(t, p.Queue)
	testenv.Drain(t, other)

	// Explicitly: a fixed destination.
	testenv.Publish(t, "", p.DLQ, forged("fixed-1", x, "", nil))
	mustRun(t, "", "dlq", "replay", p.Queue, "--url", url, "--exchange", "", "--routing-key", other)
	testenv.Eventually(t, wait, "the replay in the named queue", func() bool { return count(t, other) == 1 })
	if n := count(t, p.Queue); n != 0 {
		t.Fatalf("fixed route also reached the work queue: %d", n)
	}
	if _, _, err := runCLI(t, "", "dlq", "replay", p.Queue, "--url", url, "--to-original-route", "--routing-key", other); err == nil {
		t.Fatal("--to-original-route with --routing-key accepted")
	}
}

// TestDLQReplayRefusesAnotherQueuesDeadLetter: a dead letter that says it
// failed in another queue is not replayed into this one; the error names
// both; it stays in the dead-letter queue.
func TestDLQReplayRefusesAnotherQueuesDeadLetter(t *testing.T) {
	url := testenv.RequireAMQP(t)
	p := declareQueue(t, topology.Queue{Name: testenv.Name(t, "q"), NoRetry: true})
	testenv.Publish(t, "", p.DLQ, forged("stray-1", "", "payments", amqp.Table{idemq.HeaderQueue: "payments"}))
	out, _, err := runCLI(t, "", "dlq", "replay", p.Queue, "--url", url)
	if err == nil {
		t.Fatalf("replay of another queue's dead letter succeeded: %q", out)
	}
	if !strings.Contains(out, `"payments"`) || !strings.Contains(out, `"`+p.Queue+`"`) {
		t.Fatalf("refusal does not name both queues: %q (%v)", out, err)
	}
	t.Logf("refused: %s%v", out, err)
	if n := count(t, p.DLQ); n != 1 {
		t.Fatalf("the refused dead letter left the DLQ: %d", n)
	}
	if n := count(t, p.Queue); n != 0 {
		t.Fatalf("the refused dead letter reached the work queue: %d", n)
	}
}

// TestDLQReplayNeedsTheWorkQueue: no work queue, no replay (passive declare).
func TestDLQReplayNeedsTheWorkQueue(t *testing.T) {
	url := testenv.RequireAMQP(t)
	dlq := testenv.Name(t, "gone") + ".dlq" // its work queue does not exist
	ch := testenv.Channel(t)
	if _, err := ch.QueueDeclare(dlq, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.DeleteQueue(dlq) })
	testenv.Publish(t, "", dlq, forged("m-1", "", "x", nil))
	_, _, err := runCLI(t, "", "dlq", "replay", dlq, "--url", url)
	if err == nil || !strings.Contains(err.Error(), "work queue \""+strings.TrimSuffix(dlq, ".dlq")+"\"") {
		t.Fatalf("replay with no work queue: %v", err)
	}
	t.Logf("refused: %v", err)
	if n := count(t, dlq); n != 1 {
		t.Fatalf("dead letter gone: %d", n)
	}
}

// TestDLQDuplicatesCollapsed: a dead letter duplicated (a consumer killed
// between the dead letter's confirm and its ack) is listed once and
// replayed once; its copy is dropped and counted.
func TestDLQDuplicatesCollapsed(t *testing.T) {
	url := testenv.RequireAMQP(t)
	p := declareQueue(t, topology.Queue{Name: testenv.Name(t, "q"), NoRetry: true})
	var msgs []amqp.Publishing
	for _, id := range []string{"d-1", "d-2", "d-1", "d-3"} {
		msgs = append(msgs, forged(id, "", p.Queue, amqp.Table{idemq.HeaderQueue: p.Queue}))
	}
	// Two copies of a message whose dead letters got fresh IDs (its own was
	// invalid): the original ID is in a header.
	for _, id := range []string{"fresh-a", "fresh-b"} {
		msgs = append(msgs, forged(id, "", p.Queue, amqp.Table{idemq.HeaderQueue: p.Queue, idemq.HeaderOriginalMessageID: "bad\x01id"}))
	}
	testenv.Publish(t, "", p.DLQ, msgs...)

	list := mustRun(t, "", "dlq", "list", p.Queue, "--url", url)
	if strings.Count(list, "d-1") != 1 || strings.Count(list, "fresh-") != 1 {
		t.Fatalf("list shows duplicates:\n%s", list)
	}
	if !strings.Contains(list, "6 message(s), 4 shown, 2 duplicate(s) collapsed") {
		t.Fatalf("list header:\n%s", list)
	}
	show := mustRun(t, "", "dlq", "show", p.Queue, "--url", url, "--id", "d-1", "--limit", "0")
	if strings.Count(show, "message id:") != 1 || !strings.Contains(show, "duplicates:") {
		t.Fatalf("show:\n%s", show)
	}
	if n := count(t, p.DLQ); n != 6 {
		t.Fatalf("list/show consumed: %d", n)
	}
	out := mustRun(t, "", "dlq", "replay", p.Queue, "--url", url)
	if !strings.Contains(out, "replayed 4, duplicates dropped 2") {
		t.Fatalf("replay output:\n%s", out)
	}
	testenv.Eventually(t, wait, "4 replays in the work queue", func() bool { return count(t, p.Queue) == 4 })
	if n := count(t, p.DLQ); n != 0 {
		t.Fatalf("%d left in the DLQ", n)
	}
	ids := map[string]int{}
	for _, d := range testenv.Drain(t, p.Queue) {
		ids[d.MessageId]++
	}
	if ids["d-1"] != 1 || ids["d-2"] != 1 || ids["d-3"] != 1 || ids["fresh-a"]+ids["fresh-b"] != 1 {
		t.Fatalf("replayed %v", ids)
	}
}
