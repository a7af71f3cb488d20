package outagetest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/sqldb/postgres"
	"github.com/idemq/idemq/topology"
)

// outage is how long the dependency stays down: well beyond the retry
// policy's quick retries (3 × ≤20ms) and delays (50ms, 100ms).
const outage = 5 * time.Second

func logger() *slog.Logger {
	if testing.Verbose() && os.Getenv("OUTAGE_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// fixture is a work queue with two short retry delays and a DLQ, a
// publisher for the policy, and a backlog of n messages.
type fixture struct {
	q    topology.Queue
	pub  *idemq.Publisher
	ids  []string
	topo topology.Topology
}

func newFixture(t *testing.T, n int) *fixture {
	t.Helper()
	testenv.RequireAMQP(t)
	q := topology.Queue{Name: testenv.Name(t, "outage"), Type: topology.Quorum,
		RetryDelays: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond}}
	topo := topology.Topology{Queues: []topology.Queue{q}}
	p := topology.ForQueue(q)
	t.Cleanup(func() {
		names := []string{p.Queue, p.DLQ}
		for _, r := range p.Retries {
			names = append(names, r.Name)
		}
		testenv.DeleteQueue(names...)
	})
	ch := testenv.Channel(t)
	if err := topology.Declare(context.Background(), ch, topo); err != nil {
		t.Fatal(err)
	}
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: testenv.AMQPURL(), Setup: topology.SetupFunc(topo), Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	f := &fixture{q: q, pub: pub, topo: topo}
	msgs := make([]amqp.Publishing, n)
	for i := range msgs {
		id := fmt.Sprintf("m-%04d", i)
		f.ids = append(f.ids, id)
		msgs[i] = amqp.Publishing{MessageId: id, Body: []byte(id)}
	}
	testenv.Publish(t, "", q.Name, msgs...)
	return f
}

// policy is the failure policy under test: few attempts, short delays.
func (f *fixture) policy() idemq.FailurePolicy {
	p, err := retry.New(retry.ForTopology(f.q, retry.Config{Sender: f.pub, QuickAttempts: 3, MaxAttempts: 3}))
	if err != nil {
		panic(err)
	}
	return p
}

// run starts the consumer and stops it at cleanup.
func run(t *testing.T, cfg idemq.ConsumerConfig, h idemq.Handler) *idemq.Consumer {
	t.Helper()
	cfg.Pipeline.Handler = h
	c, err := idemq.NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Error("consumer did not stop within 60s")
		}
	})
	return c
}

// holder holds handlers while closed: the test stops the dependency
// under transactions (and handlers) in flight.
type holder struct {
	mu sync.Mutex
	ch chan struct{}
}

func (h *holder) close() { h.mu.Lock(); h.ch = make(chan struct{}); h.mu.Unlock() }
func (h *holder) open() {
	h.mu.Lock()
	if h.ch != nil {
		close(h.ch)
		h.ch = nil
	}
	h.mu.Unlock()
}
func (h *holder) wait() {
	h.mu.Lock()
	ch := h.ch
	h.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// deadLettered reports whether the DLQ holds a message (without taking it).
func (f *fixture) deadLettered(t *testing.T) bool {
	ready, _ := testenv.QueueCounts(t, topology.ForQueue(f.q).DLQ)
	return ready > 0
}

// checkNoDeadLetters fails the test if anything reached the DLQ.
func (f *fixture) checkNoDeadLetters(t *testing.T) {
	t.Helper()
	if dl := testenv.Drain(t, topology.ForQueue(f.q).DLQ); len(dl) > 0 {
		r, _ := dl[0].Headers[idemq.HeaderReason].(string)
		e, _ := dl[0].Headers[idemq.HeaderError].(string)
		t.Errorf("%d valid messages dead-lettered during a %v outage (first: %s, reason %s: %s)", len(dl), outage, dl[0].MessageId, r, e)
	}
}

// A PostgreSQL outage of several seconds during a backlog, in front of an
// inbox consumer whose retry policy would give up after ~200 ms: no
// message is dead-lettered, none is lost, each is applied exactly once,
// and the backlog drains within seconds of the restart.
func TestPostgresOutageDeadLettersNothing(t *testing.T) {
	const n = 120
	pg := testenv.StartPrivatePostgres(t)
	db := pg.CreateDB("outage")
	ctx := context.Background()
	pool := testenv.PgxPool(t, db)
	if _, err := pool.Exec(ctx, `CREATE TABLE applied (message_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(ctx, postgres.Pgx(pool), inbox.Config{Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, n)
	var hold holder
	h := ib.Handler(func(ctx context.Context, tx pgx.Tx, d *idemq.Delivery) error {
		hold.wait() // in-flight transactions outlive the server
		_, err := tx.Exec(ctx, `INSERT INTO applied (message_id) VALUES ($1)`, d.MessageID)
		return err
	})
	var counters idemq.Counters
	cfg := idemq.ConsumerConfig{Queue: f.q.Name, Prefetch: 20, Workers: 4, Recorder: &counters, Logger: logger(),
		Pipeline: idemq.Pipeline{Policy: f.policy()}}
	configureBreaker(&cfg, ib.Probe)
	run(t, cfg, h)

	testenv.Eventually(t, 60*time.Second, "the backlog to be under way", func() bool {
		return counters.Get(idemq.CountProcessed) >= 20
	})
	hold.close()
	pg.Stop()
	down := time.Now()
	hold.open()
	waitOutage(t, &counters)
	time.Sleep(outage - time.Since(down)) // the outage itself
	pg.Start()
	restarted := time.Now()
	var got int
	testenv.Eventually(t, 60*time.Second, "every message applied after the restart (or one dead-lettered)", func() bool {
		_ = pool.QueryRow(ctx, `SELECT count(DISTINCT message_id) FROM applied`).Scan(&got)
		return got >= n || f.deadLettered(t)
	})
	t.Logf("%d applied %v after the restart; counters %v", got, time.Since(restarted).Round(time.Millisecond), counters.Snapshot())
	f.checkNoDeadLetters(t)
	if got < n {
		t.Errorf("%d of %d messages applied", got, n)
	}
	rows, err := pool.Query(ctx, `SELECT message_id, count(*) FROM applied GROUP BY message_id HAVING count(*) > 1`)
	if err != nil {
		t.Fatal(err)
	}
	dups, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err == nil && len(dups) > 0 {
		t.Errorf("applied more than once: %v", dups)
	}
	checkOutageCounted(t, &counters)
}

// A Redis outage of several seconds in front of a dedup guard (fail-closed)
// during a backlog: nothing dead-lettered or lost, nothing sent through a
// delay queue (an outage is not an attempt, and a TTL queue is what a
// broker restart may drop), each applied once, the backlog drains soon
// after.
func TestRedisOutageDeadLettersNothing(t *testing.T) {
	const n = 120
	rs := testenv.StartPrivateRedis(t, true)
	rc := rs.Client()
	t.Cleanup(func() { rc.Close() })
	store, err := redisstore.New(rc, redisstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, n)
	var mu sync.Mutex
	applied := map[string]int{}
	var hold holder
	h := idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		hold.wait() // in-flight handlers outlive the server
		mu.Lock()
		applied[d.MessageID]++
		mu.Unlock()
		return nil
	})
	distinct := func() int { mu.Lock(); defer mu.Unlock(); return len(applied) }
	guard, err := dedup.NewGuard(dedup.Config{Store: store, Prefix: "outage", Lease: 5 * time.Second,
		StoreTimeout: time.Second, Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	var counters idemq.Counters
	cfg := idemq.ConsumerConfig{Queue: f.q.Name, Prefetch: 20, Workers: 4, Recorder: &counters, Logger: logger(),
		Pipeline: idemq.Pipeline{Policy: f.policy(), Guard: guard}}
	configureBreaker(&cfg, dedup.Probe(store))
	run(t, cfg, h)

	testenv.Eventually(t, 60*time.Second, "the backlog to be under way", func() bool { return distinct() >= 20 })
	hold.close()
	rs.Kill()
	down := time.Now()
	hold.open()
	waitOutage(t, &counters)
	time.Sleep(outage - time.Since(down))
	rs.Start()
	restarted := time.Now()
	testenv.Eventually(t, 60*time.Second, "every message applied after the restart (or one dead-lettered)", func() bool {
		return distinct() >= n || f.deadLettered(t)
	})
	t.Logf("%d applied %v after the restart; counters %v", distinct(), time.Since(restarted).Round(time.Millisecond), counters.Snapshot())
	f.checkNoDeadLetters(t)
	if got := distinct(); got < n {
		t.Errorf("%d of %d messages applied", got, n)
	}
	mu.Lock()
	for id, k := range applied {
		if k > 1 {
			t.Errorf("%s applied %d times", id, k)
		}
	}
	mu.Unlock()
	if r := counters.Get(idemq.CountRetried); r > 0 {
		t.Errorf("%d deliveries sent through a delay queue during the outage (an outage is not an attempt)", r)
	}
	checkOutageCounted(t, &counters)
}
