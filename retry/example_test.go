package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/topology"
)

// The README's retry policy: one topology.Queue declares the queues (Setup)
// and configures the policy (ForTopology), so names and delays cannot
// drift apart. A poison message runs 1 + len(delays) times, then lands in
// "<queue>.dlq" with the reason and the attempts in its headers.
func ExamplePolicy() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // it needs its servers: never hang without them
	defer cancel()
	run := idemq.NewMessageID()[24:] // unique per run: this example shares its servers
	// Defaults: 1s, 5s, 30s, 2m, 10m (12m36s of waiting before the DLQ);
	// short delays here, so the example dead-letters in well under a second.
	q := topology.Queue{Name: "orders-" + run, RetryDelays: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond}}
	setup := topology.SetupFunc(topology.Topology{Queues: []topology.Queue{q}})
	defer deleteQueues(q)
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{Setup: setup})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	// New refuses at startup what could never be republished (a delay
	// without its retry queue, a dead-letter queue the topology does not
	// declare).
	policy, err := retry.New(retry.ForTopology(q, retry.Config{
		Sender:        pub,
		QuickAttempts: 1, // default 3 in-process runs per delivery
	}))
	if err != nil {
		log.Fatal(err)
	}
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{
		Queue: q.Name,
		Setup: setup,
		Pipeline: idemq.Pipeline{
			Policy: policy, // decides; the consumer carries the decisions out
			// Guard: a dedup.NewGuard — always inside the policy.
			Handler: idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
				return errors.New("no such account") // or idemq.Permanent(err): straight to the DLQ
			}),
		},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	if err := pub.Publish(ctx, idemq.Message{ID: "order-7", RoutingKey: q.Name, Body: []byte(`{}`)}); err != nil {
		log.Fatal(err)
	}
	dead := getOne(topology.DLQName(q.Name))
	stop()
	<-done
	fmt.Println("dead letter:", dead.MessageId)
	fmt.Println("reason:", dead.Headers[idemq.HeaderReason])
	fmt.Println("attempts:", dead.Headers[idemq.HeaderAttempts])
	fmt.Println("error:", dead.Headers[idemq.HeaderError])
	// Output:
	// dead letter: order-7
	// reason: max-attempts
	// attempts: 3
	// error: no such account
}

// getOne waits for one message in queue and acks it.
func getOne(queue string) amqp.Delivery {
	conn, err := amqp.Dial(testenv.AMQPURL())
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			log.Fatal(err)
		}
		if ok {
			return d
		}
	}
	log.Fatalf("nothing in %s within a minute", queue)
	return amqp.Delivery{}
}

func deleteQueues(q topology.Queue) {
	names := []string{q.Name, topology.DLQName(q.Name)}
	for _, d := range q.EffectiveDelays() {
		names = append(names, topology.RetryQueueName(q.Name, d))
	}
	testenv.DeleteQueue(names...)
}

// How long the default delays take to dead-letter a poison message, and how
// to shorten them: set RetryDelays on the queue (topology.yaml
// retry_delays: [200ms, 2s]) — the policy follows through ForTopology.
func ExampleForTopology_delays() {
	total := func(ds []time.Duration) (t time.Duration) {
		for _, d := range ds {
			t += d
		}
		return t
	}
	def := topology.Queue{Name: "orders"}
	fmt.Println("default:", def.EffectiveDelays(), "total", total(def.EffectiveDelays()))
	short := topology.Queue{Name: "orders", RetryDelays: []time.Duration{200 * time.Millisecond, 2 * time.Second}}
	fmt.Println("short:", short.EffectiveDelays(), "total", total(short.EffectiveDelays()))
	// Output:
	// default: [1s 5s 30s 2m0s 10m0s] total 12m36s
	// short: [200ms 2s] total 2.2s
}
