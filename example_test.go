package idemq_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
)

// apply stands for your business effect.
func apply(ctx context.Context, id string, body []byte) error { return nil }

// declareQueue is a SetupFunc declaring one durable queue (in a real
// program: topology.SetupFunc over a topology.yaml).
func declareQueue(name string) idemq.SetupFunc {
	return func(ctx context.Context, ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(name, true, false, false, false, nil)
		return err
	}
}

// The README's consumer and publisher: a nil error acks, an error goes to
// the failure policy. Without a guard or an inbox, a duplicate (order-1001
// published twice) runs twice — the layers of dedup/ and inbox/ stop that.
func ExampleConsumer() {
	queue := "orders-" + idemq.NewMessageID() // unique per run; "orders" in your program
	defer testenv.DeleteQueue(queue)
	setup := declareQueue(queue)

	p, err := idemq.NewPublisher(idemq.PublisherConfig{Setup: setup}) // URL: $IDEMQ_AMQP_URL, else amqp://guest:guest@localhost:5672/
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // it needs its servers: never hang without them
	defer cancel()
	for _, id := range []string{"order-1001", "order-1002", "order-1001"} {
		// The default exchange routes by queue name: RoutingKey is the queue.
		if err := p.Publish(ctx, idemq.Message{ID: id, RoutingKey: queue, Body: []byte(`{"amount":10}`)}); err != nil {
			log.Fatal(err)
		}
	}

	applied := make(chan string)
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{
		Queue:   queue,
		Setup:   setup,
		Workers: 1, // default 4; one keeps this example's output in order
		Pipeline: idemq.Pipeline{
			Handler: idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
				id, _ := d.ID() // the message ID, decided once by the consumer (ConsumerConfig.ID)
				if err := apply(ctx, id, d.Body); err != nil {
					return err // the failure policy decides: retry, dead-letter, reject
				}
				applied <- id
				return nil // acks
			}),
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }() // until runCtx is cancelled (SIGTERM in a real program)
	for range 3 {
		select {
		case id := <-applied:
			fmt.Println("applied", id)
		case <-time.After(time.Minute):
			log.Fatal("no delivery within a minute")
		}
	}
	stop() // finishes in-flight work, acks it, then Run returns
	fmt.Println("Run:", <-done)
	// Output:
	// applied order-1001
	// applied order-1002
	// applied order-1001
	// Run: <nil>
}

// An unroutable message is an error, never a silent drop: publishes are
// mandatory and confirmed.
func ExamplePublisher() {
	p, err := idemq.NewPublisher(idemq.PublisherConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = p.Publish(ctx, idemq.Message{ID: "order-1001", RoutingKey: "no-such-queue-" + idemq.NewMessageID(), Body: []byte(`{}`)})
	fmt.Println(errors.Is(err, idemq.ErrUnroutable))
	err = p.Publish(ctx, idemq.Message{RoutingKey: "orders", Body: []byte(`{}`)})
	fmt.Println(err)
	// Output:
	// true
	// idemq: missing message ID
}
