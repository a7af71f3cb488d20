package idemq_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
)

// One batch with every kind of outcome: each message gets its own answer,
// as Publish would give it, and only the routable ones reach the queue.
func TestPublishBatchAnswersEachMessage(t *testing.T) {
	testenv.RequireAMQP(t)
	queue := testenv.Queue(t, nil)
	var rec idemq.Counters
	// MaxInFlight 16: the batch goes in slices.
	p, err := idemq.NewPublisher(idemq.PublisherConfig{Logger: quietLogger(), Dial: testenv.Dial, Recorder: &rec, MaxInFlight: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const n = 50
	msgs := make([]idemq.Message, n)
	headers := amqp.Table{"k": "v"}
	for i := range msgs {
		msgs[i] = idemq.Message{ID: fmt.Sprintf("b-%d", i), RoutingKey: queue, Body: []byte{byte(i)}, Headers: headers}
	}
	msgs[3].RoutingKey = testenv.Name(t, "nowhere")                       // returned
	msgs[7].ID = ""                                                       // refused: no ID
	msgs[11].ID = "bad\nid"                                               // refused: invalid ID
	msgs[19].Headers = amqp.Table{"bad": struct{}{}}                      // refused: not encodable
	msgs[23].Headers = amqp.Table{"x-huge": strings.Repeat("h", 140<<10)} // refused: over frame_max
	msgs[42].RoutingKey = testenv.Name(t, "nowhere")                      // returned
	errs := p.PublishBatch(ctx, msgs)
	if len(errs) != n {
		t.Fatalf("%d answers for %d messages", len(errs), n)
	}
	want := map[int]func(error) bool{
		3:  func(err error) bool { var re *idemq.ReturnedError; return errors.As(err, &re) && re.MessageID == "b-3" },
		7:  func(err error) bool { return errors.Is(err, idemq.ErrMissingMessageID) },
		11: func(err error) bool { return errors.Is(err, idemq.ErrInvalidMessageID) },
		19: func(err error) bool { return errors.Is(err, idemq.ErrInvalidHeaders) },
		23: func(err error) bool {
			var pe *idemq.PermanentError
			return errors.Is(err, idemq.ErrMessageTooLarge) && errors.As(err, &pe)
		},
		42: func(err error) bool { return errors.Is(err, idemq.ErrUnroutable) },
	}
	for i, err := range errs {
		if check, ok := want[i]; ok {
			if !check(err) {
				t.Errorf("message %d: err = %v", i, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("message %d: %v", i, err)
		}
	}
	if len(headers) != 1 {
		t.Fatalf("the caller's headers were modified: %v", headers)
	}
	got := testenv.Drain(t, queue)
	if len(got) != n-len(want) {
		t.Fatalf("queue has %d messages, want %d", len(got), n-len(want))
	}
	seen := map[string]bool{}
	for _, d := range got {
		seen[d.MessageId] = true
		if d.DeliveryMode != amqp.Persistent || d.Headers["k"] != "v" {
			t.Fatalf("delivery %+v", d)
		}
	}
	for i := range msgs {
		if _, bad := want[i]; !bad && !seen[msgs[i].ID] {
			t.Fatalf("%s confirmed but not in the queue", msgs[i].ID)
		}
	}
	if c := rec.Get(idemq.CountPublished); c != int64(n-len(want)) {
		t.Fatalf("published counter = %d, want %d", c, n-len(want))
	}
	if g := rec.Get(idemq.GaugePublishInFlight); g != 0 {
		t.Fatalf("in-flight gauge = %d after the batch, want 0", g)
	}
}

// Batches published while the connection is cut lose nothing: every
// message reported confirmed is in the queue, and every message of every
// batch is eventually confirmed (the unconfirmed ones are sent again).
func TestPublishBatchSurvivesConnectionCuts(t *testing.T) {
	testenv.RequireRealBroker(t, "cuts TCP connections through a proxy")
	proxy, url := testenv.AMQPProxy(t)
	queue := testenv.Queue(t, nil)
	var rec idemq.Counters
	p, err := idemq.NewPublisher(idemq.PublisherConfig{URL: url, Logger: quietLogger(), Recorder: &rec, Retry: backoffFast()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	const batches, size = 40, 100
	var sent atomic.Int64
	errc := make(chan error, 1)
	go func() {
		defer close(errc)
		for b := range batches {
			msgs := make([]idemq.Message, size)
			for i := range msgs {
				id := fmt.Sprintf("pb-%d-%d", b, i)
				msgs[i] = idemq.Message{ID: id, RoutingKey: queue, Body: []byte(id)}
			}
			for i, err := range p.PublishBatch(ctx, msgs) {
				if err != nil {
					errc <- fmt.Errorf("batch %d message %d: %w", b, i, err)
					return
				}
			}
			sent.Add(size)
		}
	}()
	for cut := 1; cut <= 3; cut++ {
		target := int64(cut * batches * size / 4)
		testenv.Eventually(t, 60*time.Second, "publishing progress", func() bool { return sent.Load() >= target })
		proxy.Cut()
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	inQueue := map[string]int{}
	for _, d := range testenv.Drain(t, queue) {
		inQueue[d.MessageId]++
	}
	if len(inQueue) != batches*size {
		t.Fatalf("%d distinct IDs in the queue, want %d", len(inQueue), batches*size)
	}
	if rec.Get(idemq.CountReconnects) < 3 {
		t.Fatalf("reconnects = %d, want ≥ 3", rec.Get(idemq.CountReconnects))
	}
	t.Logf("retries %d, reconnects %d, duplicates in queue %d",
		rec.Get(idemq.CountPublishRetries), rec.Get(idemq.CountReconnects), sumDup(inQueue))
}

// A batch whose context ends answers every message with an error that
// wraps the context's.
func TestPublishBatchHonoursContext(t *testing.T) {
	p, err := idemq.NewPublisher(idemq.PublisherConfig{URL: "amqp://guest:guest@127.0.0.1:1/", Logger: quietLogger(), Retry: backoffFast()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	errs := p.PublishBatch(ctx, []idemq.Message{{ID: "a", RoutingKey: "q"}, {ID: "b", RoutingKey: "q"}})
	for i, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("message %d: err = %v, want one wrapping context.DeadlineExceeded", i, err)
		}
	}
}

// Concurrent batches larger together than MaxInFlight take their slots of
// the window one batch at a time: two batches each holding part of the
// window and waiting for the rest would wait until their context ends.
func TestPublishBatchesShareTheWindow(t *testing.T) {
	testenv.RequireAMQP(t)
	queue := testenv.Queue(t, nil)
	p, err := idemq.NewPublisher(idemq.PublisherConfig{Logger: quietLogger(), Dial: testenv.Dial, MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const senders, rounds, size = 6, 30, 8
	errc := make(chan error, senders)
	for s := range senders {
		go func() {
			for r := range rounds {
				msgs := make([]idemq.Message, size)
				for i := range msgs {
					msgs[i] = idemq.Message{ID: fmt.Sprintf("w-%d-%d-%d", s, r, i), RoutingKey: queue}
				}
				for _, err := range p.PublishBatch(ctx, msgs) {
					if err != nil {
						errc <- err
						return
					}
				}
			}
			errc <- nil
		}()
	}
	for range senders {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if got := len(testenv.Drain(t, queue)); got != senders*rounds*size {
		t.Fatalf("queue has %d messages, want %d", got, senders*rounds*size)
	}
}
