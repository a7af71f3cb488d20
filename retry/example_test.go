package retry_test

import (
	"context"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/topology"
)

// Wiring: one topology.Queue declares the queues (Setup) and configures the
// policy (ForTopology), so names and delays cannot drift apart.
func ExamplePolicy() {
	q := topology.Queue{Name: "orders", Type: topology.Quorum, RetryDelays: []time.Duration{time.Second, time.Minute}}
	setup := topology.SetupFunc(topology.Topology{Queues: []topology.Queue{q}})
	pub := idemq.NewPublisher(idemq.PublisherConfig{Setup: setup})
	defer pub.Close()
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{
		Queue: q.Name,
		Setup: setup,
		Middleware: []idemq.Middleware{
			retry.Policy(retry.ForTopology(q, retry.Config{Publisher: pub})),
			// dedup.Guard(store, dedup.Config{}) goes here, inside the policy.
		},
	}, idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		return nil // or idemq.Permanent(err), idemq.Reject(reason, err), any error to retry
	}))
	if err != nil {
		panic(err)
	}
	_ = c.Run // c.Run(ctx) consumes until ctx is cancelled
}
