package dedup_test

import (
	"context"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
)

// apply stands for your business effect.
func apply(ctx context.Context, orderID string, body []byte) error { return nil }

// A consumer whose handler runs once per order, however many times RabbitMQ
// delivers it: the guard claims the order ID in Redis before the handler,
// marks it done after, and releases it if the handler fails.
func ExampleGuard() {
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:6379"}})
	defer rdb.Close()
	store := redisstore.New(rdb, redisstore.Config{}) // or dedup.NewMemory(dedup.MemoryConfig{}) in one process

	guard, err := dedup.NewGuard(dedup.Config{
		Store:  store,
		Lease:  30 * time.Second, // renewed by a heartbeat while the handler runs
		Window: 24 * time.Hour,   // how long a done order is remembered
	})
	if err != nil {
		log.Fatal(err)
	}
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{
		Queue: "orders",
		Group: "billing", // keys: idemq:billing:<order ID>
		// The business key from the body; the AMQP message_id if absent.
		// Decided once per delivery: every layer keys on it.
		ID: idemq.IDConfig{Extractor: idemq.FromJSONField("order.id")},
		Pipeline: idemq.Pipeline{
			Guard: guard, // inside the failure policy, outside the handler
			Handler: idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
				orderID, _ := d.ID() // the ID every layer deduplicated on
				return apply(ctx, orderID, d.Body)
			}),
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_ = c.Run(ctx)
}
