// Command orders is the whole of idemq in one program: an orders service
// writes an order and its message in one PostgreSQL transaction (the
// outbox), a relay publishes committed messages with confirms, and a
// billing consumer applies each order exactly once — a retry policy with
// delay queues and a dead-letter queue, a Redis dedup guard, and a
// PostgreSQL inbox row committed with the effect. One order is sent twice
// (a relay that resent after a lost confirm) and one is poison.
//
// It exits 0 when every order was billed once and the poison order was
// dead-lettered, 1 otherwise.
//
//	make services && eval "$(make -s env)" && go run ./examples/orders
//
// The queues come from topology.yaml next to this file (embedded; -topology
// reads another). -suffix appends to every queue and table name, so runs
// on shared servers do not meet (make test uses it); everything the run
// created is removed at the end unless -keep.
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/sqldb/postgres"
	"github.com/idemq/idemq/topology"
)

//go:embed topology.yaml
var sampleTopology string

// Config is what the program needs; every field has a default from the
// environment of `make env`.
type Config struct {
	AMQPURL, PostgresURL, RedisURL string
	Topology                       string // YAML; default the embedded topology.yaml
	Suffix                         string // appended to queue, table and key names
	Keep                           bool   // keep queues, tables and keys at the end
	Timeout                        time.Duration
	Logger                         *slog.Logger
}

func main() {
	cfg := Config{
		AMQPURL:     env("IDEMQ_AMQP_URL", idemq.DefaultURL),
		PostgresURL: env("IDEMQ_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
		RedisURL:    env("IDEMQ_REDIS_URL", "redis://127.0.0.1:6379/0"),
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	topoFile := flag.String("topology", "", "topology YAML (default: the embedded topology.yaml)")
	flag.StringVar(&cfg.Suffix, "suffix", "", "appended to queue, table and key names")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep the queues, tables and keys")
	flag.DurationVar(&cfg.Timeout, "timeout", 2*time.Minute, "give up after")
	flag.Parse()
	if *topoFile != "" {
		b, err := os.ReadFile(*topoFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "orders:", err)
			os.Exit(1)
		}
		cfg.Topology = string(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
	defer cancel()
	res, err := Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
	fmt.Print(res)
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Result is what a run observed.
type Result struct {
	Billed       map[string]int // order ID → invoices written
	Duplicates   int64          // deliveries suppressed by the guard or the inbox
	DeadLettered []string       // message IDs in the dead-letter queue
}

func (r Result) String() string {
	var b strings.Builder
	for _, id := range []string{"order-1", "order-2", "order-3", "order-4"} {
		fmt.Fprintf(&b, "%s billed %d time(s)\n", id, r.Billed[id])
	}
	fmt.Fprintf(&b, "duplicates suppressed: %d\ndead-lettered: %v\n", r.Duplicates, r.DeadLettered)
	return b.String()
}

// errPoison is the handler's verdict on the poison order.
var errPoison = errors.New("amount must be positive")

// Run runs the orders service, the relay and the billing consumer until
// every order is settled, and checks the outcome.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if cfg.Topology == "" {
		cfg.Topology = sampleTopology
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	topo, err := topology.Load(strings.NewReader(cfg.Topology))
	if err != nil {
		return Result{}, err
	}
	for i := range topo.Queues {
		topo.Queues[i].Name += cfg.Suffix
	}
	q := topo.Queues[0]
	setup := topology.SetupFunc(topo)

	pool, err := pgxpool.New(ctx, cfg.PostgresURL)
	if err != nil {
		return Result{}, err
	}
	defer pool.Close()
	opt, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return Result{}, err
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()

	tables := struct{ orders, invoices, outbox, inbox string }{
		"orders" + sqlName(cfg.Suffix), "invoices" + sqlName(cfg.Suffix), "idemq_outbox" + sqlName(cfg.Suffix), "idemq_inbox" + sqlName(cfg.Suffix)}
	prefix := "orders-example" + cfg.Suffix
	if !cfg.Keep {
		defer cleanup(pool, rdb, q, prefix, tables.orders, tables.invoices, tables.outbox, tables.inbox)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+tables.orders+` (id TEXT PRIMARY KEY, amount BIGINT NOT NULL);
		CREATE TABLE IF NOT EXISTS `+tables.invoices+` (order_id TEXT NOT NULL, amount BIGINT NOT NULL)`); err != nil {
		return Result{}, err
	}

	// The orders service: the order row and its message, one transaction.
	store, err := outbox.NewStore(ctx, postgres.Pgx(pool), outbox.StoreConfig{Table: tables.outbox})
	if err != nil {
		return Result{}, err
	}
	placeOrder := func(id string, amount int) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+tables.orders+` VALUES ($1, $2)`, id, amount); err != nil {
				return err
			}
			return store.Add(ctx, postgres.PgxTx(tx), outbox.Message{ID: id, RoutingKey: q.Name, Body: fmt.Appendf(nil, "%d", amount)})
		})
	}

	// The relay: committed rows to the broker, with confirms.
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: cfg.AMQPURL, Setup: setup, Logger: cfg.Logger})
	if err != nil {
		return Result{}, err
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(outbox.RelayConfig{Store: store, Publisher: pub, Logger: cfg.Logger})
	if err != nil {
		return Result{}, err
	}

	// The billing consumer: retry policy ⊃ guard ⊃ inbox handler.
	policy, err := retry.New(retry.ForTopology(q, retry.Config{Sender: pub, QuickAttempts: 1}))
	if err != nil {
		return Result{}, err
	}
	guardStore, err := redisstore.New(rdb, redisstore.Config{})
	if err != nil {
		return Result{}, err
	}
	guard, err := dedup.NewGuard(dedup.Config{Store: guardStore, Prefix: prefix})
	if err != nil {
		return Result{}, err
	}
	ib, err := inbox.New(ctx, postgres.Pgx(pool), inbox.Config{Table: tables.inbox})
	if err != nil {
		return Result{}, err
	}
	bill := ib.Handler(func(ctx context.Context, tx pgx.Tx, d *idemq.Delivery) error {
		id, _ := d.ID()
		var amount int64
		if _, err := fmt.Sscan(string(d.Body), &amount); err != nil {
			return idemq.Permanent(err)
		}
		if amount <= 0 {
			return errPoison // retried with the topology's delays, then dead-lettered
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+tables.invoices+` VALUES ($1, $2)`, id, amount)
		return err
	})
	consumer, err := idemq.NewConsumer(idemq.ConsumerConfig{
		URL: cfg.AMQPURL, Queue: q.Name, Group: "billing", Setup: setup, Logger: cfg.Logger,
		StartupAttempts: 10,
		Pipeline:        idemq.Pipeline{Policy: policy, Guard: guard, Handler: bill},
	})
	if err != nil {
		return Result{}, err
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errs := make(chan error, 2)
	go func() { errs <- relay.Run(runCtx) }()
	go func() { errs <- consumer.Run(runCtx) }()
	select {
	case <-consumer.Ready():
	case err := <-errs:
		return Result{}, fmt.Errorf("startup: %w", err)
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}

	for i, amount := range []int{100, 250, -5, 75} { // order-3 is poison
		if err := placeOrder(fmt.Sprint("order-", i+1), amount); err != nil {
			return Result{}, err
		}
	}
	// A relay killed between the confirm and the mark sends a row again,
	// with the same message ID: the guard (or the inbox) suppresses it.
	if err := pub.Publish(ctx, idemq.Message{ID: "order-1", RoutingKey: q.Name, Body: []byte("100")}); err != nil {
		return Result{}, err
	}

	var res Result
	for {
		res, err = observe(ctx, pool, tables.invoices, q)
		if err != nil {
			return res, err
		}
		res.Duplicates = consumer.Counters().Get(idemq.CountDuplicates)
		if len(res.DeadLettered) > 0 && res.Duplicates > 0 && len(res.Billed) == 3 {
			break
		}
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("not settled before the timeout: %w\n%s", ctx.Err(), res)
		case <-time.After(100 * time.Millisecond):
		}
	}
	stop()
	for range 2 {
		if err := <-errs; err != nil {
			return res, err
		}
	}
	for id, n := range res.Billed {
		if n != 1 {
			return res, fmt.Errorf("%s billed %d times, want once", id, n)
		}
	}
	if len(res.DeadLettered) != 1 || res.DeadLettered[0] != "order-3" {
		return res, fmt.Errorf("dead-lettered %v, want [order-3]", res.DeadLettered)
	}
	return res, nil
}

// observe reads the invoices and peeks at the dead-letter queue.
func observe(ctx context.Context, pool *pgxpool.Pool, invoices string, q topology.Queue) (Result, error) {
	res := Result{Billed: map[string]int{}}
	rows, err := pool.Query(ctx, `SELECT order_id, count(*) FROM `+invoices+` GROUP BY order_id`)
	if err != nil {
		return res, err
	}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return res, err
		}
		res.Billed[id] = n
	}
	if err := rows.Err(); err != nil {
		return res, err
	}
	res.DeadLettered, err = peekIDs(topology.DLQName(q.Name))
	return res, err
}

var dlqURL = env("IDEMQ_AMQP_URL", idemq.DefaultURL)

// peekIDs returns the message IDs in queue and leaves the messages there
// (`idemq dlq list` shows them with their reasons).
func peekIDs(queue string) ([]string, error) {
	conn, err := amqp.Dial(dlqURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close() // unacked gets go back to the queue
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	var ids []string
	for {
		d, ok, err := ch.Get(queue, false)
		if err != nil || !ok {
			return ids, err
		}
		ids = append(ids, d.MessageId)
	}
}

// sqlName turns a suffix into something a table name may hold.
func sqlName(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '_'
	}, s)
}

// cleanup removes what the run created: queues, tables and their
// migration records, dedup keys.
func cleanup(pool *pgxpool.Pool, rdb *redis.Client, q topology.Queue, prefix string, tables ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if conn, err := amqp.Dial(dlqURL); err == nil {
		if ch, err := conn.Channel(); err == nil {
			names := []string{q.Name, topology.DLQName(q.Name)}
			for _, d := range q.EffectiveDelays() {
				names = append(names, topology.RetryQueueName(q.Name, d))
			}
			for _, n := range names {
				_, _ = ch.QueueDelete(n, false, false, false)
			}
		}
		conn.Close()
	}
	for _, t := range tables {
		_, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS `+t)
		_, _ = pool.Exec(ctx, `DELETE FROM idemq_migrations WHERE table_name = $1`, t)
	}
	iter := rdb.Scan(ctx, 0, "*"+prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
}
