package redisbloom_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/bloom"
	"github.com/idemq/idemq/dedup/bloom/redisbloom"
	"github.com/idemq/idemq/dedup/sqlstore"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sqldb/postgres"
)

// The README's Bloom tier: done IDs in a rotating Bloom filter in Redis,
// the exact SQL store as the record of truth that checks the filter's
// "maybe" (so a false positive never drops a new message), behind the
// usual guard.
func ExampleNewStore() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // it needs its servers: never hang without them
	defer cancel()
	run := idemq.NewMessageID()[24:] // unique per run: this example shares its servers
	queue, table, prefix := "orders-"+run, "dedup_"+run, "example-"+run
	defer testenv.DeleteQueue(queue)

	opt, err := redis.ParseURL(testenv.RedisURL()) // $IDEMQ_REDIS_URL
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(opt) // any go-redis v9 client
	defer rdb.Close()
	db, err := sql.Open("pgx", testenv.PostgresURL()) // $IDEMQ_POSTGRES_URL
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	defer cleanup(rdb, db, prefix, table)

	// sqlStore: an exact dedup store (*sqlstore.Store here; a redisstore.Store works too).
	sqlStore, err := sqlstore.New(ctx, postgres.Std(db), sqlstore.Config{Table: table})
	if err != nil {
		log.Fatal(err)
	}
	store, err := redisbloom.NewStore(rdb, redisbloom.StoreConfig{
		Filter: redisbloom.Config{
			Filter:    bloom.FilterConfig{Window: 24 * time.Hour, ExpectedIDs: 100_000, FPRate: 1e-4}, // 1e9 a day: see the bloom package doc
			KeyPrefix: prefix + ":",
		},
		Verifier: bloom.RecordOfTruth(sqlStore), // optional: without it, suspects are set aside (bloom.NewRouter)
	})
	if err != nil {
		log.Fatal(err)
	}
	guard, err := dedup.NewGuard(dedup.Config{Store: store, Prefix: prefix})
	if err != nil {
		log.Fatal(err)
	}

	setup := func(ctx context.Context, ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(queue, true, false, false, false, nil)
		return err
	}
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{Setup: setup})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	for _, id := range []string{"order-1", "order-2", "order-1"} {
		if err := pub.Publish(ctx, idemq.Message{ID: id, RoutingKey: queue, Body: []byte(`{}`)}); err != nil {
			log.Fatal(err)
		}
	}
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{Queue: queue, Setup: setup, Workers: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Pipeline: idemq.Pipeline{Guard: guard, Handler: idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil })}})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	n := c.Counters()
	for deadline := time.Now().Add(time.Minute); n.Get(idemq.CountProcessed)+n.Get(idemq.CountDuplicates) < 3 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	<-done
	fmt.Println("processed:", n.Get(idemq.CountProcessed), "duplicates:", n.Get(idemq.CountDuplicates))
	// Output:
	// processed: 2 duplicates: 1
}

func cleanup(rdb *redis.Client, db *sql.DB, prefix, table string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // it needs its servers: never hang without them
	defer cancel()
	iter := rdb.Scan(ctx, 0, "*"+prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
	_, _ = db.ExecContext(ctx, `DROP TABLE IF EXISTS `+table)
	_, _ = db.ExecContext(ctx, `DELETE FROM idemq_migrations WHERE table_name = $1`, table)
}
