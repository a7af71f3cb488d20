package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/deadletter"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/topology"
)

const wait = 45 * time.Second

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func declareQueue(t *testing.T, q topology.Queue) topology.Plan {
	t.Helper()
	p := topology.ForQueue(q)
	t.Cleanup(func() {
		names := []string{p.Queue, p.DLQ}
		for _, r := range p.Retries {
			names = append(names, r.Name)
		}
		testenv.DeleteQueue(names...)
	})
	if err := topology.DeclareQueue(context.Background(), testenv.Channel(t), q); err != nil {
		t.Fatal(err)
	}
	return p
}

func count(t *testing.T, q string) int { n, _ := testenv.QueueCounts(t, q); return n }

// TestDLQRoundTrip: dead letters of three kinds, listed and shown without
// being consumed, one replayed after its bug is "fixed" and processed once,
// the rest purged after a confirmation.
func TestDLQRoundTrip(t *testing.T) {
	url := testenv.RequireAMQP(t)
	q := topology.Queue{Name: testenv.Name(t, "q"), RetryDelays: []time.Duration{100 * time.Millisecond, 300 * time.Millisecond}}
	p := declareQueue(t, q)
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: url, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	var fixed atomic.Bool
	var mu sync.Mutex
	processed := map[string]int{}
	var replayed *idemq.Delivery
	h := idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		switch {
		case d.MessageID == "order-1" && !fixed.Load():
			return idemq.Permanent(errors.New("unknown currency \"XYZ\""))
		case d.MessageID == "order-2":
			return errors.New("payment gateway timeout")
		}
		mu.Lock()
		processed[d.MessageID]++
		if d.MessageID == "order-1" {
			replayed = d
		}
		mu.Unlock()
		return nil
	})
	policy, err := retry.New(retry.ForTopology(q, retry.Config{Sender: pub, QuickAttempts: 1}))
	if err != nil {
		t.Fatal(err)
	}
	cfg := idemq.ConsumerConfig{
		URL: url, Queue: p.Queue, Group: "billing", Logger: quiet(), AckBatch: 1,
		Pipeline: idemq.Pipeline{Policy: policy, Handler: h},
	}
	c, err := idemq.NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	defer stop()
	<-c.Ready()

	testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "order-1", ContentType: "application/json",
		Body: []byte(`{"order":1,"currency":"XYZ"}`), Headers: amqp.Table{"tenant": "acme"}})
	testenv.Eventually(t, wait, "order-1 dead-lettered", func() bool { return count(t, p.DLQ) == 1 })
	testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "order-2", Body: []byte(`{"order":2}`)})
	testenv.Eventually(t, wait, "order-2 dead-lettered", func() bool { return count(t, p.DLQ) == 2 })
	stop()
	// A third one the broker dead-lettered by itself (a consumer without a
	// failure policy rejected it).
	testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "order-3", Body: []byte{0xff, 0x00}})
	ch := testenv.Channel(t)
	testenv.Eventually(t, wait, "order-3 rejected", func() bool {
		d, ok, err := ch.Get(p.Queue, false)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			_ = d.Nack(false, false)
		}
		return ok
	})
	testenv.Eventually(t, wait, "order-3 dead-lettered", func() bool { return count(t, p.DLQ) == 3 })

	names := map[string]string{p.Queue: "QUEUE"}
	list := mustRun(t, "", "dlq", "list", p.Queue, "--url", url)
	golden(t, "dlq_list", list, names)
	golden(t, "dlq_list_json", mustRun(t, "", "dlq", "list", p.Queue, "--url", url, "-o", "json", "--reason", "max-attempts"), names)
	golden(t, "dlq_show", mustRun(t, "", "dlq", "show", p.DLQ, "--url", url, "--id", "order-1"), names)
	golden(t, "dlq_show_broker", mustRun(t, "", "dlq", "show", p.Queue, "--url", url, "--reason", "broker:rejected"), names)
	// Non-destructive, order kept.
	if n := count(t, p.DLQ); n != 3 {
		t.Fatalf("list consumed dead letters: %d left", n)
	}
	if again := mustRun(t, "", "dlq", "list", p.Queue, "--url", url); again != list {
		t.Fatalf("second list differs (order changed?):\n%s\nvs\n%s", again, list)
	}
	var js struct {
		Total    int `json:"total"`
		Messages []struct {
			MessageID string `json:"message_id"`
			Attempts  int    `json:"attempts"`
		} `json:"messages"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "", "dlq", "list", p.Queue, "--url", url, "-o", "json")), &js); err != nil {
		t.Fatal(err)
	}
	if js.Total != 3 || len(js.Messages) != 3 || js.Messages[1].MessageID != "order-2" || js.Messages[1].Attempts != 3 {
		t.Fatalf("json list %+v", js)
	}

	golden(t, "dlq_replay_dry_run", mustRun(t, "", "dlq", "replay", p.Queue, "--url", url, "--reason", "permanent", "--dry-run"), names)
	if n := count(t, p.DLQ); n != 3 {
		t.Fatalf("dry run changed the DLQ: %d", n)
	}

	// The bug is fixed: replay order-1 and only it.
	fixed.Store(true)
	ctx2, cancel2 := context.WithCancel(context.Background())
	done2 := make(chan struct{})
	var once2 sync.Once
	stop2 := func() { once2.Do(func() { cancel2(); <-done2 }) }
	defer stop2()
	cfg.Pipeline.Handler = h
	c2, err := idemq.NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c2.Run(ctx2); close(done2) }()
	<-c2.Ready()
	golden(t, "dlq_replay", mustRun(t, "", "dlq", "replay", p.Queue, "--url", url, "--id", "order-1"), names)
	testenv.Eventually(t, wait, "order-1 processed after the replay", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return processed["order-1"] == 1
	})
	testenv.Eventually(t, wait, "work queue settled", func() bool { return count(t, p.Queue) == 0 })
	stop2()
	mu.Lock()
	if processed["order-1"] != 1 || len(processed) != 1 {
		t.Fatalf("processed %v, want order-1 once", processed)
	}
	if replayed.MessageID != "order-1" || retry.Attempt(replayed.Headers) != 1 || replayed.HeaderString("tenant") != "acme" ||
		replayed.HeaderString(idemq.HeaderReason) != "" || replayed.Exchange != "" || replayed.RoutingKey != p.Queue {
		t.Fatalf("replayed delivery %+v", replayed)
	}
	mu.Unlock()
	if n := count(t, p.DLQ); n != 2 {
		t.Fatalf("%d dead letters left, want 2", n)
	}

	// Purge: refused without a yes, done with one.
	if _, errOut, err := runCLI(t, "no\n", "dlq", "purge", p.Queue, "--url", url); err == nil || !strings.Contains(errOut, "[y/N]") {
		t.Fatalf("purge without confirmation: err %v, prompt %q", err, errOut)
	}
	if n := count(t, p.DLQ); n != 2 {
		t.Fatalf("unconfirmed purge deleted: %d left", n)
	}
	golden(t, "dlq_purge", mustRun(t, "y\n", "dlq", "purge", p.Queue, "--url", url), names)
	if n := count(t, p.DLQ); n != 0 {
		t.Fatalf("%d left after purge", n)
	}
}

func deadLetter(id, queue string) amqp.Publishing {
	return amqp.Publishing{MessageId: id, Body: []byte(id), Headers: amqp.Table{
		idemq.HeaderReason: idemq.ReasonPermanent, idemq.HeaderOriginalExchange: "",
		idemq.HeaderOriginalRoutingKey: queue, idemq.HeaderAttempts: int64(1), idemq.HeaderAttempt: int64(4),
	}}
}

func TestDLQReplayRateAndLimit(t *testing.T) {
	url := testenv.RequireAMQP(t)
	p := declareQueue(t, topology.Queue{Name: testenv.Name(t, "q"), NoRetry: true})
	var msgs []amqp.Publishing
	for i := 0; i < 4; i++ {
		msgs = append(msgs, deadLetter(fmt.Sprintf("m-%d", i), p.Queue))
	}
	testenv.Publish(t, "", p.DLQ, msgs...)
	start := time.Now()
	out := mustRun(t, "", "dlq", "replay", p.Queue, "--url", url, "--rate", "10", "--limit", "3")
	elapsed := time.Since(start)
	t.Logf("3 replays at --rate 10 took %v", elapsed)
	if elapsed < 200*time.Millisecond {
		t.Fatalf("3 messages at 10/s took %v, want >= 200ms", elapsed)
	}
	if !strings.Contains(out, "replayed 3, duplicates dropped 0, skipped 0 (filters), failed 0") {
		t.Fatalf("output %q", out)
	}
	got := testenv.Drain(t, p.Queue)
	if len(got) != 3 || got[0].MessageId != "m-0" || got[2].MessageId != "m-2" {
		t.Fatalf("work queue got %d messages", len(got))
	}
	for _, d := range got {
		if _, ok := d.Headers[idemq.HeaderAttempt]; ok {
			t.Fatalf("attempt header not reset: %v", d.Headers)
		}
		if _, ok := d.Headers[idemq.HeaderReplayedAt]; !ok {
			t.Fatalf("no replayed-at header: %v", d.Headers)
		}
	}
	left := testenv.Drain(t, p.DLQ)
	if len(left) != 1 || left[0].MessageId != "m-3" {
		t.Fatalf("DLQ left %d", len(left))
	}
}

func TestDLQReplayManyShowsProgress(t *testing.T) {
	url := testenv.RequireAMQP(t)
	p := declareQueue(t, topology.Queue{Name: testenv.Name(t, "q"), NoRetry: true})
	var msgs []amqp.Publishing
	for i := 0; i < 120; i++ {
		msgs = append(msgs, deadLetter(fmt.Sprintf("bulk-%03d", i), p.Queue))
	}
	testenv.Publish(t, "", p.DLQ, msgs...)
	out, errOut, err := runCLI(t, "", "dlq", "replay", p.Queue, "--url", url, "-o", "json")
	if err != nil {
		t.Fatal(err, errOut)
	}
	var res deadletter.ReplayResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Replayed) != 120 {
		t.Fatalf("json %v: %d replayed", err, len(res.Replayed))
	}
	testenv.Publish(t, "", p.DLQ, msgs[:101]...)
	_, errOut, err = runCLI(t, "", "dlq", "replay", p.Queue, "--url", url)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errOut, "replaying") {
		t.Fatalf("no progress bar on stderr for 101 messages: %q", errOut)
	}
	testenv.Eventually(t, wait, "221 replayed messages in the work queue", func() bool { return count(t, p.Queue) == 221 })
	if n := count(t, p.DLQ); n != 0 {
		t.Fatalf("%d left", n)
	}
}
