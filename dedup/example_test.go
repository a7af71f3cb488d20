package dedup_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/topology"
)

// apply stands for your business effect.
func apply(ctx context.Context, orderID string, body []byte) error { return nil }

// The README's guard: a consumer whose handler runs once per order however
// many times RabbitMQ delivers it. The guard claims the order ID in Redis
// before the handler, marks it done after, and releases it if the handler
// fails (the retry policy then retries it: never skipped as a duplicate).
func ExampleGuard() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // it needs its servers: never hang without them
	defer cancel()
	run := idemq.NewMessageID()[24:] // unique per run: this example shares its servers

	// rdb: any go-redis v9 client.
	opt, err := redis.ParseURL(testenv.RedisURL()) // $IDEMQ_REDIS_URL, else redis://127.0.0.1:6379/0
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	// q: the work queue with its retry and dead-letter queues (topology.yaml in a real program).
	q := topology.Queue{Name: "orders-" + run, RetryDelays: []time.Duration{time.Second, 5 * time.Second}}
	setup := topology.SetupFunc(topology.Topology{Queues: []topology.Queue{q}})
	defer deleteQueues(q)
	// pub: the publisher the policy republishes retries and dead letters with.
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{Setup: setup})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	store, err := redisstore.New(rdb, redisstore.Config{}) // or dedup.NewMemory, or a SQL store
	if err != nil {
		log.Fatal(err)
	}
	policy, err := retry.New(retry.ForTopology(q, retry.Config{Sender: pub})) // delays, then the DLQ
	if err != nil {
		log.Fatal(err)
	}
	guard, err := dedup.NewGuard(dedup.Config{
		Store:  store,
		Prefix: "example-" + run, // keys: <Prefix>:<Group>:<order ID>; default "idemq"
		Lease:  30 * time.Second, // renewed by a heartbeat while the handler runs
		Window: 24 * time.Hour,   // how long a done order is remembered
	})
	if err != nil {
		log.Fatal(err)
	}
	defer deleteKeys(rdb, "*example-"+run+":*")

	applied := make(chan string, 3)
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{
		Queue: q.Name,
		Group: "billing",
		Setup: setup,
		// One worker: the duplicate runs after the first copy is done (two
		// copies at once: the second waits for the first one's lease).
		Workers: 1,
		// The business key from the body; the AMQP message_id if absent.
		// Decided once per delivery: every layer keys on it.
		ID: idemq.IDConfig{Extractor: idemq.FromJSONField("order.id")},
		// The order is fixed: the policy decides outside everything, the
		// guard runs inside it, the handler inside the guard.
		Pipeline: idemq.Pipeline{Policy: policy, Guard: guard, Handler: idemq.HandlerFunc(
			func(ctx context.Context, d *idemq.Delivery) error {
				orderID, _ := d.ID() // the ID every layer deduplicated on
				if err := apply(ctx, orderID, d.Body); err != nil {
					return err
				}
				applied <- orderID
				return nil
			})},
		Logger: quiet(),
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()

	// Order 1001 is sent twice (a publisher that resent after a lost confirm).
	for i, id := range []string{"1001", "1002", "1001"} {
		body := fmt.Sprintf(`{"order":{"id":"order-%s"}}`, id)
		if err := pub.Publish(ctx, idemq.Message{ID: fmt.Sprint("msg-", i), RoutingKey: q.Name, Body: []byte(body)}); err != nil {
			log.Fatal(err)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for c.Counters().Get(idemq.CountProcessed)+c.Counters().Get(idemq.CountDuplicates) < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	<-done
	close(applied)
	for id := range applied {
		fmt.Println("applied", id)
	}
	fmt.Println("duplicates suppressed:", c.Counters().Get(idemq.CountDuplicates))
	// Unordered output:
	// applied order-1001
	// applied order-1002
	// duplicates suppressed: 1
}
