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
	// New refuses at startup what could never be republished (a delay
	// without its retry queue, a dead-letter queue the topology does not
	// declare).
	policy, err := retry.New(retry.ForTopology(q, retry.Config{Sender: pub}))
	if err != nil {
		panic(err)
	}
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{
		Queue: q.Name,
		Setup: setup,
		Pipeline: idemq.Pipeline{
			Policy: policy, // decides; the consumer carries the decisions out
			// Guard: a dedup.NewGuard — always inside the policy.
			Handler: idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
				return nil // or idemq.Permanent(err), idemq.Reject(reason, err), any error to retry
			}),
		},
	})
	if err != nil {
		panic(err)
	}
	_ = c.Run // c.Run(ctx) consumes until ctx is cancelled
}
