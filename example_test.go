package idemq_test

import (
	"context"
	"log"

	"github.com/idemq/idemq"
)

func apply(ctx context.Context, id string, body []byte) error { return nil }

// The README's consumer: a nil error acks, an error goes to the failure policy.
func ExampleConsumer() {
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{
		Queue:    "orders",
		Prefetch: 200, // default
		Workers:  4,   // default
		Pipeline: idemq.Pipeline{
			Handler: idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
				id, _ := d.ID()               // the message ID, decided once by the consumer (ConsumerConfig.ID)
				return apply(ctx, id, d.Body) // nil acks; an error goes to the failure policy
			}),
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // in a real program: cancelled on SIGTERM
	_ = c.Run(ctx)
}

// The README's publisher: the ID is your business key.
func ExamplePublisher() {
	p := idemq.NewPublisher(idemq.PublisherConfig{})
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := p.Publish(ctx, idemq.Message{ID: "order-1001", RoutingKey: "orders", Body: []byte(`{}`)})
	_ = err // a cancelled context: the publish did not happen
}
