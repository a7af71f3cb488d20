package inbox_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sqldb/postgres"
)

// exampleEnv is what the inbox examples share: a pgx pool, a unique queue
// and unique tables (they run on shared servers), and their cleanup.
type exampleEnv struct {
	pool           *pgxpool.Pool
	queue          string
	accounts, ibox string
}

func newExampleEnv(ctx context.Context) *exampleEnv {
	run := idemq.NewMessageID()[24:]
	pool, err := pgxpool.New(ctx, testenv.PostgresURL()) // $IDEMQ_POSTGRES_URL
	if err != nil {
		log.Fatal(err)
	}
	e := &exampleEnv{pool: pool, queue: "transfers-" + run, accounts: "accounts_" + run, ibox: "inbox_" + run}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+e.accounts+` (id TEXT PRIMARY KEY, balance BIGINT NOT NULL);
		INSERT INTO `+e.accounts+` VALUES ('a-1', 0)`); err != nil {
		log.Fatal(err)
	}
	return e
}

// startExample gives an example its context (bounded: it needs its
// servers, and must never hang without them) and its environment; done
// cleans both up.
func startExample() (context.Context, *exampleEnv, func()) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	env := newExampleEnv(ctx)
	return ctx, env, func() { env.close(); cancel() }
}

func (e *exampleEnv) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // it needs its servers: never hang without them
	defer cancel()
	_, _ = e.pool.Exec(ctx, `DROP TABLE IF EXISTS `+e.accounts+`, `+e.ibox)
	_, _ = e.pool.Exec(ctx, `DELETE FROM idemq_migrations WHERE table_name = $1`, e.ibox)
	e.pool.Close()
	testenv.DeleteQueue(e.queue)
}

func (e *exampleEnv) balance(ctx context.Context) int64 {
	var b int64
	if err := e.pool.QueryRow(ctx, `SELECT balance FROM `+e.accounts+` WHERE id = 'a-1'`).Scan(&b); err != nil {
		log.Fatal(err)
	}
	return b
}

// inbox is the examples' inbox on the pgx pool, in the example's own table.
func (e *exampleEnv) inbox(ctx context.Context) *inbox.Inbox[pgx.Tx] {
	ib, err := inbox.New(ctx, postgres.Pgx(e.pool), inbox.Config{Table: e.ibox})
	if err != nil {
		log.Fatal(err)
	}
	return ib
}

// run consumes ids with handler and prints the counters and the balance.
func (e *exampleEnv) run(ctx context.Context, handler idemq.Handler, ids ...string) {
	n := e.consume(ctx, ids, handler)
	fmt.Println("processed:", n.Get(idemq.CountProcessed), "duplicates:", n.Get(idemq.CountDuplicates))
	fmt.Println("balance:", e.balance(ctx))
}

// consume publishes ids (each a transfer of 10 to account a-1) and runs a
// consumer with handler until every delivery was processed or suppressed.
func (e *exampleEnv) consume(ctx context.Context, ids []string, handler idemq.Handler) *idemq.Counters {
	setup := func(ctx context.Context, ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(e.queue, true, false, false, false, nil)
		return err
	}
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{Setup: setup})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	for _, id := range ids {
		if err := pub.Publish(ctx, idemq.Message{ID: id, RoutingKey: e.queue, Body: []byte("10")}); err != nil {
			log.Fatal(err)
		}
	}
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{Queue: e.queue, Setup: setup, Pipeline: idemq.Pipeline{Handler: handler},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	n := c.Counters()
	deadline := time.Now().Add(time.Minute)
	for n.Get(idemq.CountProcessed)+n.Get(idemq.CountDuplicates) < int64(len(ids)) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	<-done
	return n
}

// The README's inbox over a pgx pool: the handler's effect and the inbox
// row commit in one transaction, so a duplicate (transfer t-1 sent twice)
// changes the balance once — even if the process dies between the commit
// and the ack. The inbox table's migrations are applied by New.
func Example() {
	ctx, env, done := startExample()
	defer done()
	pool := env.pool // *pgxpool.Pool from pgxpool.New(ctx, "postgres://…")

	ib, err := inbox.New(ctx, postgres.Pgx(pool), inbox.Config{Table: env.ibox}) // Table default "idemq_inbox"; also mysql.Std(db), sqlite.Std(db)
	if err != nil {
		log.Fatal(err)
	}
	handler := ib.Handler(func(ctx context.Context, tx pgx.Tx, d *idemq.Delivery) error {
		amount, account := string(d.Body), "a-1" // in a real program: decoded from d.Body
		_, err := tx.Exec(ctx, `UPDATE `+env.accounts+` SET balance = balance + $1 WHERE id = $2`, amount, account)
		return err // nil commits the effect and the inbox row together, then acks
	})

	env.run(ctx, handler, "t-1", "t-2", "t-1") // t-1 twice
	// Output:
	// processed: 2 duplicates: 1
	// balance: 20
}

// The README's batch inbox: up to Size deliveries in one transaction, their
// inbox rows in one multi-row INSERT, one commit and one multiple-ack.
func ExampleInbox_Batch() {
	ctx, env, done := startExample()
	defer done()

	ib := env.inbox(ctx) // inbox.New(ctx, postgres.Pgx(pool), inbox.Config{})
	batch := ib.Batch(func(ctx context.Context, tx pgx.Tx, d *idemq.Delivery) error {
		_, err := tx.Exec(ctx, `UPDATE `+env.accounts+` SET balance = balance + $1 WHERE id = 'a-1'`, string(d.Body))
		return err // an error rolls the batch back; it runs again with a savepoint per delivery
	}, inbox.BatchConfig{Size: 50, Concurrency: 4}) // Concurrency: the consumer's Workers (default 4)

	env.run(ctx, idemq.HandlerFunc(batch.Handle), "t-1", "t-2", "t-3", "t-2") // t-2 twice
	// Output:
	// processed: 3 duplicates: 1
	// balance: 30
}

func ExampleInbox_BatchFunc() {
	ctx, env, done := startExample()
	defer done()

	ib := env.inbox(ctx) // inbox.New(ctx, postgres.Pgx(pool), inbox.Config{})
	// Called once per batch with its fresh deliveries (duplicates left
	// out): one statement applies them all.
	batch := ib.BatchFunc(func(ctx context.Context, tx pgx.Tx, ds []*idemq.Delivery) error {
		var sum int64
		for _, d := range ds {
			v, err := strconv.ParseInt(string(d.Body), 10, 64)
			if err != nil {
				return idemq.Permanent(err) // the batch runs again per delivery: only this one fails
			}
			sum += v
		}
		_, err := tx.Exec(ctx, `UPDATE `+env.accounts+` SET balance = balance + $1 WHERE id = 'a-1'`, sum)
		return err
	}, inbox.BatchConfig{Size: 50, Concurrency: 4})

	env.run(ctx, idemq.HandlerFunc(batch.Handle), "t-1", "t-2", "t-3", "t-2") // t-2 twice
	// Output:
	// processed: 3 duplicates: 1
	// balance: 30
}

// A statement per delivery without a round trip per delivery: the batch
// handler queues each delivery's statement in a pgx.Batch and sends them
// as one pipeline. A failed statement fails SendBatch's Close, the batch
// rolls back and runs again per delivery, so only the delivery whose
// statement failed goes to the failure policy.
func ExampleInbox_BatchFunc_pipeline() {
	ctx, env, done := startExample()
	defer done()

	ib := env.inbox(ctx) // inbox.New(ctx, postgres.Pgx(pool), inbox.Config{})
	batch := ib.BatchFunc(func(ctx context.Context, tx pgx.Tx, ds []*idemq.Delivery) error {
		q := &pgx.Batch{}
		for _, d := range ds {
			q.Queue(`UPDATE `+env.accounts+` SET balance = balance + $1 WHERE id = 'a-1'`, string(d.Body))
		}
		return tx.SendBatch(ctx, q).Close() // one round trip; the first failed statement's error
	}, inbox.BatchConfig{Size: 50, Concurrency: 4})

	env.run(ctx, idemq.HandlerFunc(batch.Handle), "t-1", "t-2", "t-3", "t-2") // t-2 twice
	// Output:
	// processed: 3 duplicates: 1
	// balance: 30
}
