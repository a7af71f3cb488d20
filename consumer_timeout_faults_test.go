//go:build faults

package idemq_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/redistest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/sqldb/postgres"
	"github.com/idemq/idemq/topology"
)

// brokerConsumerTimeout is the private node's consumer_timeout.
const brokerConsumerTimeout = 5 * time.Second

// TestFaultConsumerTimeout runs against a private RabbitMQ node started with
// consumer_timeout = 5s (checked every 250ms): the shared broker's global
// config must not change, and 3.10 has no per-queue or per-consumer timeout
// (x-consumer-timeout arrived in 3.12). A handler whose first run would
// outlive the broker's timeout (it honours its context) is cancelled by
// idemq below it; the dedup guard releases the claim (dedup mode) or the
// inbox rolls back the effect row the run had written (inbox mode), the
// failure policy sends the delivery to its retry queue, and the redelivery
// applies the effect (a Redis INCR; a PostgreSQL row) once. The broker never closes the channel. Without the bound
// the broker closes it (PRECONDITION_FAILED, delivery acknowledgement timed
// out) at 5s and redelivers while the first handler still runs.
//
// In the fault phase (-tags faults) because the private node takes 6-15s to
// boot.
func TestFaultConsumerTimeout(t *testing.T) {
	url := testenv.PrivateRabbit(t, testenv.RabbitNodeConfig{ConsumerTimeout: brokerConsumerTimeout})
	t.Run("dedup", func(t *testing.T) {
		rdb, prefix := testenv.Redis(t)
		effect := prefix + ":effect"
		guard, err := dedup.NewGuard(dedup.Config{Store: redistest.Store(t, rdb, redisstore.Config{KeyPrefix: prefix + ":"}), Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		consumerTimeoutScenario(t, url, guard.Middleware(),
			func(ctx context.Context, d *idemq.Delivery) error { return rdb.Incr(ctx, effect).Err() },
			func() int64 { n, _ := rdb.Get(context.Background(), effect).Int64(); return n })
	})
	t.Run("inbox", func(t *testing.T) {
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, testenv.PostgresDB(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		if _, err := pool.Exec(ctx, "CREATE TABLE effects (id serial PRIMARY KEY, message_id text NOT NULL)"); err != nil {
			t.Fatal(err)
		}
		ib, err := inbox.New(ctx, postgres.Pgx(pool), inbox.Config{})
		if err != nil {
			t.Fatal(err)
		}
		// The effect row is written before the slow part, in the inbox's
		// transaction: the timed-out run must roll it back.
		wrap := func(next idemq.Handler) idemq.Handler {
			return ib.Handler(func(ctx context.Context, tx pgx.Tx, d *idemq.Delivery) error {
				if _, err := tx.Exec(ctx, "INSERT INTO effects (message_id) VALUES ($1)", d.MessageID); err != nil {
					return err
				}
				return next.Handle(ctx, d)
			})
		}
		consumerTimeoutScenario(t, url, wrap,
			func(ctx context.Context, d *idemq.Delivery) error { return nil },
			func() int64 {
				var n int64
				_ = pool.QueryRow(context.Background(), "SELECT count(*) FROM effects").Scan(&n)
				return n
			})
	})
}

// consumerTimeoutScenario runs one message through a consumer with the
// failure policy outside layer (the guard, or the inbox): the first run of the handler is slow (3x the
// broker's timeout) and honours its context; apply is the real effect and
// applied counts it.
func consumerTimeoutScenario(t *testing.T, url string, layer idemq.Middleware,
	apply func(ctx context.Context, d *idemq.Delivery) error, applied func() int64) {
	q := topology.Queue{Name: testenv.Name(t, "q"), RetryDelays: []time.Duration{200 * time.Millisecond}}
	setup := func(ctx context.Context, ch *amqp.Channel) error { return topology.DeclareQueue(ctx, ch, q) }
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: url, Setup: setup, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })

	var logs logBuffer
	var runs atomic.Int64
	var firstDeadline atomic.Int64 // ns from receipt to the first run's deadline
	var firstReceipt atomic.Int64  // unix ns
	var cause atomic.Value
	policy, err := retry.New(retry.ForTopology(q, retry.Config{Sender: pub, QuickAttempts: 1}))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := runConsumer(t, idemq.ConsumerConfig{
		URL: url, Queue: q.Name, Setup: setup, Workers: 2, Prefetch: 10, Reconnect: backoffFast(),
		// The broker's value; the margin leaves time to settle the delivery
		// on a busy machine (the default would be 500ms).
		ConsumerTimeout: brokerConsumerTimeout, ConsumerTimeoutMargin: 1500 * time.Millisecond,
		Logger:   logs.logger(),
		Pipeline: idemq.Pipeline{Policy: policy, Middleware: []idemq.Middleware{layer}},
	}, idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		if runs.Add(1) == 1 {
			firstReceipt.Store(d.ReceivedAt.UnixNano())
			if dl, ok := ctx.Deadline(); ok {
				firstDeadline.Store(int64(dl.Sub(d.ReceivedAt)))
			}
			select {
			case <-ctx.Done():
				cause.Store(fmt.Sprint(context.Cause(ctx)))
				return ctx.Err()
			case <-time.After(3 * brokerConsumerTimeout):
			}
		}
		return apply(ctx, d)
	}))
	if err := pub.Publish(context.Background(), idemq.Message{ID: "slow-1", RoutingKey: q.Name}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 4*brokerConsumerTimeout, "the effect applied by the redelivery", func() bool { return applied() >= 1 })
	receipt := time.Unix(0, firstReceipt.Load())

	// The broker fires at most one tick after its timeout: watch the
	// channel until then and a little beyond — a window the broker's own
	// config fixes, not a guess at how long something takes.
	testenv.Eventually(t, 4*brokerConsumerTimeout, "the broker's consumer_timeout window passed", func() bool {
		return time.Since(receipt) > brokerConsumerTimeout+time.Second
	})
	if r := c.Counters().Get(idemq.CountReconnects); r != 0 {
		t.Fatalf("the consumer reconnected %d times: the broker closed its channel at consumer_timeout:\n%s", r, logs.lines("channel closed"))
	}
	if l := logs.lines("PRECONDITION_FAILED"); len(l) > 0 {
		t.Fatalf("the broker's consumer_timeout fired: %q", l)
	}
	if dl := time.Duration(firstDeadline.Load()); dl != brokerConsumerTimeout-1500*time.Millisecond {
		t.Fatalf("first run's deadline %v after receipt, want the broker's %v minus the 1.5s margin", dl, brokerConsumerTimeout)
	}
	if s, _ := cause.Load().(string); !strings.Contains(s, idemq.ErrHandlerTimeout.Error()) {
		t.Fatalf("first run's context cause %q, want ErrHandlerTimeout", s)
	}
	if n := applied(); n != 1 {
		t.Fatalf("effect applied %d times, want 1", n)
	}
	if got := c.Counters().Get(idemq.CountProcessed); got != 1 {
		t.Fatalf("processed = %d, want 1", got)
	}
	if got := c.Counters().Get(idemq.CountHandlerTimeouts); got != 1 || runs.Load() != 2 {
		t.Fatalf("handler_timeouts %d, runs %d: want 1 and 2", got, runs.Load())
	}
	if got := c.Counters().Get(idemq.CountRetried); got != 1 {
		t.Fatalf("retried = %d, want 1 (the timed-out attempt went to its retry queue)", got)
	}
	if l := logs.lines("nears the broker's consumer_timeout", "message_id=slow-1"); len(l) != 1 {
		t.Fatalf("want one near-timeout warning, got %q", l)
	}
}
