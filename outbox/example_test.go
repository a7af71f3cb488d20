package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/postgres"
)

// The README's outbox: the order row and its message commit in one
// transaction (database/sql here; the one way to hand idemq a *sql.Tx is
// sqldb.StdTx, a pgx.Tx postgres.PgxTx), then the relay publishes the
// committed row with confirms and marks it sent. The RoutingKey must route
// somewhere: on the default exchange it is the queue's name (a row that
// cannot route is marked failed as unroutable; see `idemq outbox list`).
func ExampleSQLStore_Add() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // it needs its servers: never hang without them
	defer cancel()
	run := idemq.NewMessageID()[24:] // unique per run: this example shares its servers
	queue, orders, table := "orders-"+run, "orders_"+run, "outbox_"+run
	defer testenv.DeleteQueue(queue)

	// db: a *sql.DB ("pgx" is registered by sqldb/postgres; MySQL: "mysql" and mysql.Std(db)).
	db, err := sql.Open("pgx", testenv.PostgresURL()) // $IDEMQ_POSTGRES_URL
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+orders+` (id TEXT PRIMARY KEY, amount BIGINT NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	defer func() {
		_, _ = db.ExecContext(ctx, `DROP TABLE IF EXISTS `+orders+`, `+table)
		_, _ = db.ExecContext(ctx, `DELETE FROM idemq_migrations WHERE table_name = $1`, table)
	}()

	// store: the outbox table (default "idemq_outbox"); NewStore applies its migrations.
	store, err := outbox.NewStore(ctx, postgres.Std(db), outbox.StoreConfig{Table: table})
	if err != nil {
		log.Fatal(err)
	}

	orderID := "order-42"
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+orders+` VALUES ($1, 100)`, orderID); err != nil { // the business write
		log.Fatal(err)
	}
	if err := store.Add(ctx, sqldb.StdTx(tx), outbox.Message{ID: orderID, RoutingKey: queue, Body: []byte(`{"amount":100}`)}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil { // the message exists only if this commits
		log.Fatal(err)
	}

	// The relay (in a real program: `idemq relay --db postgres://… --amqp amqp://…`).
	declare := func(ctx context.Context, ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(queue, true, false, false, false, nil)
		return err
	}
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{Setup: declare})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(outbox.RelayConfig{Store: store, Publisher: pub, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		log.Fatal(err)
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()

	received := make(chan string, 1)
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{Queue: queue, Setup: declare,
		Pipeline: idemq.Pipeline{Handler: idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			id, _ := d.ID()
			received <- id
			return nil
		})}})
	if err != nil {
		log.Fatal(err)
	}
	consumeCtx, stopConsumer := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() { consumed <- c.Run(consumeCtx) }()
	select {
	case id := <-received:
		fmt.Println("received", id)
	case <-time.After(time.Minute):
		log.Fatal("nothing relayed within a minute")
	}
	stopConsumer()
	<-consumed
	stopRelay()
	fmt.Println("relay:", <-relayDone)
	counts, err := store.Count(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("sent rows:", counts[outbox.StateSent])
	// Output:
	// received order-42
	// relay: <nil>
	// sent rows: 1
}
