package inboxtest

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/sqldbtest"
)

const group = "inboxtest"

// quiet drops the consumer's logs: the failure tests fail on purpose.
var quiet = slog.New(slog.DiscardHandler)

// mustGuard is dedup.NewGuard; a bad config fails the test.
func mustGuard(t testing.TB, cfg dedup.Config) *dedup.Guard {
	t.Helper()
	g, err := dedup.NewGuard(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// consume runs an idemq.Consumer on queue until the test ends (or stop is
// called) and returns its counters.
func consume(t testing.TB, queue string, h idemq.Handler, mod func(*idemq.ConsumerConfig)) (*idemq.Counters, func()) {
	t.Helper()
	rec := &idemq.Counters{}
	cfg := idemq.ConsumerConfig{URL: testenv.RequireAMQP(t), Queue: queue, Group: group, Recorder: rec, AckFlushInterval: 5 * time.Millisecond, Logger: quiet}
	cfg.Pipeline.Handler = h
	if mod != nil {
		mod(&cfg)
	}
	c, err := idemq.NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	select {
	case <-c.Ready():
	case <-time.After(wait):
		cancel()
		t.Fatal("consumer not ready")
	}
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return rec, stop
}

func publishIDs(t testing.TB, queue string, list ...string) {
	t.Helper()
	msgs := make([]amqp.Publishing, len(list))
	for i, id := range list {
		msgs[i] = amqp.Publishing{MessageId: id, Body: []byte(id)}
	}
	testenv.Publish(t, "", queue, msgs...)
}

// copies returns every ID n times, shuffled: a publisher that resent each
// message after lost confirms.
func copies(list []string, n int) []string {
	var out []string
	for i := 0; i < n; i++ {
		out = append(out, list...)
	}
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func waitCount(t testing.TB, what string, want int64, recs ...*idemq.Counters) {
	t.Helper()
	testenv.Eventually(t, wait, what, func() bool {
		var n int64
		for _, r := range recs {
			n += r.Get(idemq.CountAcked)
		}
		return n >= want
	})
}

func sum(name string, recs ...*idemq.Counters) int64 {
	var n int64
	for _, r := range recs {
		n += r.Get(name)
	}
	return n
}

func testResends[T any](t *testing.T, h sqldbtest.Backend[T]) {
	e := setup(t, h)
	list := ids("r", 20)
	e.accounts(list...)
	ib := newInbox(t, e.db.DB, inbox.Config{})
	q := testenv.Queue(t, nil)
	publishIDs(t, q, copies(list, 3)...)
	rec, _ := consume(t, q, ib.Handler(effect(e.db)), nil)
	waitCount(t, "60 deliveries acked", 60, rec)
	e.wantBalances(Amount, list...)
	if p, d := rec.Get(idemq.CountProcessed), rec.Get(idemq.CountDuplicates); p != 20 || d != 40 {
		t.Fatalf("processed=%d duplicates=%d, want 20 and 40", p, d)
	}
}

func testTwoConsumers[T any](t *testing.T, h sqldbtest.Backend[T]) {
	e := setup(t, h)
	list := ids("t", 30)
	e.accounts(list...)
	ib := newInbox(t, e.db.DB, inbox.Config{})
	q := testenv.Queue(t, nil)
	// Prefetch 1 and a handler that yields make the two consumers take
	// copies of the same ID at the same time.
	mod := func(c *idemq.ConsumerConfig) { c.Prefetch = 4; c.Workers = 4 }
	h1 := ib.Handler(effect(e.db))
	r1, _ := consume(t, q, h1, mod)
	r2, _ := consume(t, q, h1, mod)
	publishIDs(t, q, copies(list, 4)...)
	waitCount(t, "120 deliveries acked", 120, r1, r2)
	e.wantBalances(Amount, list...)
	if p, d := sum(idemq.CountProcessed, r1, r2), sum(idemq.CountDuplicates, r1, r2); p != 30 || d != 90 {
		t.Fatalf("processed=%d duplicates=%d, want 30 and 90", p, d)
	}
	if r1.Get(idemq.CountAcked) == 0 || r2.Get(idemq.CountAcked) == 0 {
		t.Logf("one consumer took every delivery (acked %d / %d)", r1.Get(idemq.CountAcked), r2.Get(idemq.CountAcked))
	}
}

// selfLoop declares the test queue so a delivery nacked without requeue
// comes back: its dead-letter exchange is the default exchange and its
// dead-letter routing key the queue itself. Without the retry package (the
// failure policy) a failed handler is nacked without requeue; this stands
// in for "retried later". (RabbitMQ drops dead-letter cycles only when no
// rejection happened in the cycle; a nack is one, so the message returns.)
func selfLoop(t testing.TB) string {
	name := testenv.Name(t, "q")
	ch := testenv.Channel(t)
	if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": name,
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.DeleteQueue(name) })
	return name
}

func testFailThenSucceed[T any](t *testing.T, h sqldbtest.Backend[T]) {
	e := setup(t, h)
	list := ids("fs", 10)
	e.accounts(list...)
	ib := newInbox(t, e.db.DB, inbox.Config{})
	q := selfLoop(t)
	var mu sync.Mutex
	attempts := map[string]int{}
	hf := func(ctx context.Context, tx T, d *idemq.Delivery) error {
		// The effect is applied, then the handler fails on the first two
		// attempts: the rollback must take the effect back with it.
		if err := effect(e.db)(ctx, tx, d); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		attempts[d.MessageID]++
		if attempts[d.MessageID] <= 2 {
			return errors.New("transient failure")
		}
		return nil
	}
	publishIDs(t, q, copies(list, 2)...)
	rec, _ := consume(t, q, ib.Handler(hf), nil)
	waitCount(t, "20 deliveries acked", 20, rec)
	e.wantBalances(Amount, list...)
	if p := rec.Get(idemq.CountProcessed); p != 10 {
		t.Fatalf("processed=%d, want 10", p)
	}
	if f := rec.Get(idemq.CountFailed); f < 20 {
		t.Fatalf("failed=%d, want at least 20 (two per ID)", f)
	}
}

func testBatchPoison[T any](t *testing.T, h sqldbtest.Backend[T]) {
	e := setup(t, h)
	list := ids("bp", 12)
	e.accounts(append(list, "poison-x")...)
	ib := newInbox(t, e.db.DB, inbox.Config{})
	dlq := testenv.Queue(t, nil)
	q := testenv.Name(t, "q")
	ch := testenv.Channel(t)
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq,
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.DeleteQueue(q) })
	const size = 8
	b := ib.Batch(effect(e.db), inbox.BatchConfig{Size: size, Concurrency: size, MaxWait: 200 * time.Millisecond})
	msgs := append(copies(list, 2), "poison-x")
	publishIDs(t, q, msgs...)
	rec, _ := consume(t, q, b, func(c *idemq.ConsumerConfig) { c.Workers = size; c.Prefetch = 2 * size })
	waitCount(t, "24 deliveries acked", 24, rec)
	testenv.Eventually(t, wait, "the poison message in the dead-letter queue", func() bool {
		n, _ := testenv.QueueCounts(t, dlq)
		return n == 1
	})
	e.wantBalances(Amount, list...)
	e.wantBalances(0, "poison-x")
	if p, d := rec.Get(idemq.CountProcessed), rec.Get(idemq.CountDuplicates); p != 12 || d != 12 {
		t.Fatalf("processed=%d duplicates=%d, want 12 and 12", p, d)
	}
}

// Environment of the helper process of the kill test.
const (
	envHelper = "IDEMQ_INBOXTEST_HELPER"
	envDSN    = "IDEMQ_INBOXTEST_DSN"
	envQueue  = "IDEMQ_INBOXTEST_QUEUE"
	envFlavor = "IDEMQ_INBOXTEST_FLAVOR"
)

// HelperProcess is the child of the kill test: it consumes one message
// from the queue in $IDEMQ_INBOXTEST_QUEUE with the inbox and SIGKILLs
// itself right after the commit, before the handler returns (so before the
// ack). Each dialect's test binary serves it as
//
//	func TestHelperInboxProcess(t *testing.T) { inboxtest.HelperProcess(t, backend()) }
//
// and it skips itself unless started by the kill test.
func HelperProcess[T any](t *testing.T, h sqldbtest.Backend[T]) {
	if os.Getenv(envHelper) != "1" {
		return // only the kill test runs it, as a child process
	}
	db := open(t, h, os.Getenv(envDSN))
	ib := newInbox(t, killAfterCommit(db.DB), inbox.Config{NoMigrate: true}) // the parent migrated
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{URL: testenv.AMQPURL(), Queue: os.Getenv(envQueue), Group: group, Workers: 1, Prefetch: 1, Logger: quiet,
		Pipeline: idemq.Pipeline{Handler: ib.Handler(effect(db))}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_ = c.Run(ctx)
	t.Fatal("helper process was not killed: no delivery committed")
}

// killAfterCommit commits, then kills the process before anyone can ack.
func killAfterCommit[T any](db sqldb.Native[T]) sqldb.Native[T] {
	return wrapped[T]{db, func(tx sqldb.Tx) sqldb.Tx {
		return txHook{tx, func(ctx context.Context, tx sqldb.Tx) error {
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never returns: the ack is never sent
		}}
	}}
}

func testKilled[T any](t *testing.T, h sqldbtest.Backend[T]) {
	e := setup(t, h)
	e.accounts("k1")
	newInbox(t, e.db.DB, inbox.Config{}) // the table exists before the child starts
	q := testenv.Queue(t, nil)
	publishIDs(t, q, "k1")

	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperInboxProcess$", "-test.count=1")
	cmd.Env = testenv.Env(envHelper+"=1", envDSN+"="+e.dsn, envQueue+"="+q, envFlavor+"="+h.Name)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("helper process: %v\n%s", err, out)
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("helper process was not SIGKILLed: %v\n%s", err, out)
	}
	// The child committed the effect and died before its ack.
	e.wantBalances(Amount, "k1")
	testenv.Eventually(t, wait, "the broker to requeue the unacked delivery", func() bool {
		n, _ := testenv.QueueCounts(t, q)
		return n == 1
	})
	ib := newInbox(t, e.db.DB, inbox.Config{})
	rec, stop := consume(t, q, ib.Handler(effect(e.db)), nil)
	waitCount(t, "the redelivery acked", 1, rec)
	stop()
	e.wantBalances(Amount, "k1")
	if d, p := rec.Get(idemq.CountDuplicates), rec.Get(idemq.CountProcessed); d != 1 || p != 0 {
		t.Fatalf("duplicates=%d processed=%d, want 1 and 0", d, p)
	}
	if n, _ := testenv.QueueCounts(t, q); n != 0 {
		t.Fatalf("%d messages left in the queue", n)
	}
}

// countBegins counts the transactions opened.
func countBegins[T any](db sqldb.Native[T], n *atomic.Int64) sqldb.Native[T] {
	return wrapped[T]{db, func(tx sqldb.Tx) sqldb.Tx {
		n.Add(1)
		return tx
	}}
}

// testFastPath: dedup.Guard with a memory store in front of the inbox turns
// away completed duplicates without opening a transaction; when the store
// forgets (restart without persistence), the inbox row still stops them.
func testFastPath[T any](t *testing.T, h sqldbtest.Backend[T]) {
	e := setup(t, h)
	list := ids("fp", 10)
	e.accounts(list...)
	newInbox(t, e.db.DB, inbox.Config{})
	var begins atomic.Int64
	ib := newInbox(t, countBegins(e.db.DB, &begins), inbox.Config{NoMigrate: true})
	q := testenv.Queue(t, nil)
	run := func(store dedup.Store, msgs []string, want int64) *idemq.Counters {
		t.Helper()
		rec, stop := consume(t, q, ib.Handler(effect(e.db)), func(c *idemq.ConsumerConfig) {
			c.Pipeline.Guard = mustGuard(t, dedup.Config{Store: store})
		})
		publishIDs(t, q, msgs...)
		waitCount(t, "deliveries acked", want, rec)
		stop()
		return rec
	}
	store := dedup.NewMemory(dedup.MemoryConfig{})
	if p := run(store, list, 10).Get(idemq.CountProcessed); p != 10 {
		t.Fatalf("processed=%d for 10 fresh messages through guard + inbox, want 10 (counted once)", p)
	}
	if b := begins.Load(); b != 10 {
		t.Fatalf("%d transactions for 10 fresh messages", b)
	}
	// Resends of completed messages: the guard answers Done, no transaction.
	rec := run(store, copies(list, 2), 20)
	if b := begins.Load(); b != 10 {
		t.Fatalf("%d transactions, want still 10: the guard let duplicates reach the database", b)
	}
	if d := rec.Get(idemq.CountDuplicates); d != 20 {
		t.Fatalf("duplicates=%d, want 20", d)
	}
	// A store that forgot everything (a Redis restart without persistence):
	// the duplicates reach the inbox, whose rows are the authority.
	rec = run(dedup.NewMemory(dedup.MemoryConfig{}), list, 10)
	if b := begins.Load(); b != 20 {
		t.Fatalf("%d transactions, want 20", b)
	}
	// The inbox counted the outcome; the guard does not count it again.
	if d, p := rec.Get(idemq.CountDuplicates), rec.Get(idemq.CountProcessed); d != 10 || p != 0 {
		t.Fatalf("duplicates=%d processed=%d after the store forgot, want 10 and 0 (counted once, by the inbox)", d, p)
	}
	e.wantBalances(Amount, list...)
}

// testSharedID: the consumer decides a delivery's ID once (here from a
// header: the messages carry no AMQP message_id) and both the dedup guard
// and the inbox key on it. Before the ID moved into ConsumerConfig the
// guard took its own rule (a fallback header) and the inbox its own (the
// message_id), so the inbox rejected every such delivery as missing-id.
func testSharedID[T any](t *testing.T, h sqldbtest.Backend[T]) {
	e := setup(t, h)
	list := ids("sid", 8)
	e.accounts(list...)
	ib := newInbox(t, e.db.DB, inbox.Config{})
	store := dedup.NewMemory(dedup.MemoryConfig{})
	q := testenv.Queue(t, nil)
	rec, _ := consume(t, q, ib.Handler(effect(e.db)), func(c *idemq.ConsumerConfig) {
		c.ID = idemq.IDConfig{FallbackHeader: "x-order"}
		// Copies arrive together: the second waits for the first's
		// lease; don't make it wait the whole default lease.
		c.Pipeline.Guard = mustGuard(t, dedup.Config{Store: store, InFlightRetryAfter: 100 * time.Millisecond})
	})
	var msgs []amqp.Publishing
	for _, id := range copies(list, 2) {
		msgs = append(msgs, amqp.Publishing{Body: []byte(id), Headers: amqp.Table{"x-order": "order-" + id}})
	}
	testenv.Publish(t, "", q, msgs...)
	waitCount(t, "deliveries acked", int64(len(msgs)), rec)
	if r := rec.Get(idemq.CountRejected); r != 0 {
		t.Fatalf("%d deliveries rejected: the layers disagree on the message ID", r)
	}
	e.wantBalances(Amount, list...)
	for _, id := range list {
		if _, ok, _ := store.Get(context.Background(), dedup.Key("idemq", group, "order-"+id)); !ok {
			t.Fatalf("no guard record for order-%s", id)
		}
	}
	if n := e.int("SELECT COUNT(*) FROM idemq_inbox WHERE message_id LIKE 'order-sid-%'"); n != int64(len(list)) {
		t.Fatalf("%d inbox rows keyed on the header ID, want %d", n, len(list))
	}
}
