package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/sqldbtest"
)

// Environment of the helper child process.
const (
	envHelper  = "IDEMQ_OUTBOX_HELPER"        // "1" in the child
	envDSN     = "IDEMQ_OUTBOX_HELPER_DSN"    // database
	envTable   = "IDEMQ_OUTBOX_HELPER_TABLE"  // table
	envKill    = "IDEMQ_OUTBOX_TEST_KILL"     // "before-mark" or "after-confirms:N"
	envBatch   = "IDEMQ_OUTBOX_HELPER_BATCH"  // batch size
	envFlavor  = "IDEMQ_OUTBOX_HELPER_FLAVOR" // the backend's name
	childLease = 4 * time.Second

	childBatch       = 50
	childConcurrency = 2
)

// RunRelay runs the end-to-end cases: relays publishing through the real
// RabbitMQ, crashes (the kill cases re-execute the test binary as
// TestHelperRelayProcess, see [HelperProcess]), ordering, failures,
// purge and shutdown.
func RunRelay[T any](t *testing.T, b sqldbtest.Backend[T], f Features) {
	s := newSuite(b, f)
	cases := []struct {
		name  string
		fn    func(*testing.T, suite)
		multi bool
	}{
		{"RollbackIsNeverPublished", rollbackNever, false},
		{"CommitIsPublishedAndConsumed", commitPublished, false},
		{"KilledBetweenConfirmAndMarkResendsSameID", killBeforeMark, false},
		{"KilledMidBatchLosesNothing", killMidBatch, false},
		{"ThreeRelaysShareTheWork", threeRelays, true},
		{"OrderingPerKey", orderingPerKey, false},
		{"UnroutableAndFailingRowsDoNotBlock", unroutable, false},
		{"OrderedFailedRowBlocksItsKey", orderedFailedBlocks, false},
		{"SentRowsArePurged", purged, false},
		{"LagIsReported", lagReported, false},
		{"ShutdownDrainsTheBatch", shutdownDrains, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.multi && f.SingleRelay {
				t.Skip("Features.SingleRelay: this dialect runs one relay only")
			}
			if f.Parallel {
				t.Parallel()
			}
			c.fn(t, s)
		})
	}
}

func tctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	t.Cleanup(cancel)
	return c
}

type env struct {
	t     *testing.T
	s     suite
	dsn   string
	table string
	store *outbox.SQLStore
	inTx  inTx
	queue string
}

func setup(t *testing.T, s suite) *env {
	testenv.RequireAMQP(t)
	e := setupDB(t, s)
	e.queue = testenv.Queue(t, nil)
	return e
}

func setupDB(t *testing.T, s suite) *env {
	e := &env{t: t, s: s, dsn: s.newDB(t), table: "outbox_" + strconv.FormatInt(time.Now().UnixNano()%1e6, 10)}
	e.store, e.inTx = s.open(t, e.dsn, e.table)
	return e
}

func (e *env) msg(id string) outbox.Message {
	return outbox.Message{ID: id, RoutingKey: e.queue, Body: []byte("body-" + id), ContentType: "text/plain"}
}

// add commits msgs in one transaction.
func (e *env) add(msgs ...outbox.Message) {
	e.t.Helper()
	ctx := tctx(e.t)
	if err := e.inTx(ctx, true, func(tx sqldb.Querier) error { return e.store.Add(ctx, tx, msgs...) }); err != nil {
		e.t.Fatalf("add: %v", err)
	}
}

func (e *env) addN(prefix string, n, perTx int) []string {
	var ids []string
	for i := 0; i < n; i += perTx {
		var batch []outbox.Message
		for j := i; j < i+perTx && j < n; j++ {
			id := fmt.Sprintf("%s-%04d", prefix, j)
			ids = append(ids, id)
			batch = append(batch, e.msg(id))
		}
		e.add(batch...)
	}
	return ids
}

type relayOpt func(*outbox.RelayConfig)

// relay starts an in-process relay with its own store and publisher; it is
// stopped at cleanup (or by the returned stop, which waits for Run).
func (e *env) relay(opts ...relayOpt) (*outbox.Relay, func()) {
	e.t.Helper()
	store, _ := e.s.open(e.t, e.dsn, e.table)
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: testenv.AMQPURL(), Dial: testenv.Dial})
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := outbox.RelayConfig{
		Store: store, Publisher: pub, BatchSize: 50, Lease: childLease, PublishTimeout: 20 * time.Second,
		PollInterval: 10 * time.Millisecond, MaxPollInterval: 200 * time.Millisecond,
		RetryBackoff: backoff.Policy{Min: 20 * time.Millisecond, Max: 100 * time.Millisecond},
		Logger:       slog.New(slog.NewTextHandler(e.t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.Lease < cfg.PublishTimeout {
		cfg.Lease = 3 * cfg.PublishTimeout // never lose a lease mid-publish in tests that do not crash
	}
	r, err := outbox.NewRelay(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					e.t.Errorf("relay.Run: %v", err)
				}
			case <-time.After(60 * time.Second):
				e.t.Errorf("relay did not stop within 60s")
			}
			pub.Close()
		})
	}
	e.t.Cleanup(stop)
	return r, stop
}

// consumer accumulates deliveries from the test queue.
type consumer struct {
	mu   sync.Mutex
	got  []amqp.Delivery
	byID map[string]int
}

func (e *env) consume() *consumer {
	c := &consumer{byID: map[string]int{}}
	ch := testenv.Channel(e.t)
	dels, err := ch.Consume(e.queue, "", false, true, false, false, nil)
	if err != nil {
		e.t.Fatalf("consume: %v", err)
	}
	go func() {
		for d := range dels {
			c.mu.Lock()
			c.got = append(c.got, d)
			c.byID[d.MessageId]++
			c.mu.Unlock()
			_ = d.Ack(false)
		}
	}()
	return c
}

func (c *consumer) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byID[id]
}

func (c *consumer) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.got)
}

func (c *consumer) snapshot() []amqp.Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]amqp.Delivery(nil), c.got...)
}

func (c *consumer) hasAll(ids []string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if c.byID[id] == 0 {
			return false
		}
	}
	return true
}

func (e *env) counts() map[outbox.State]int64 {
	e.t.Helper()
	m, err := e.store.Count(tctx(e.t))
	if err != nil {
		e.t.Fatal(err)
	}
	return m
}

func (e *env) waitState(st outbox.State, n int64, within time.Duration) {
	e.t.Helper()
	testenv.Eventually(e.t, within, fmt.Sprintf("%d rows %s", n, st), func() bool {
		m, err := e.store.Count(tctx(e.t))
		return err == nil && m[st] == n
	})
}

func rollbackNever(t *testing.T, s suite) {
	e := setup(t, s)
	ctx := tctx(t)
	if err := e.inTx(ctx, false, func(tx sqldb.Querier) error { return e.store.Add(ctx, tx, e.msg("rolled-back")) }); err != nil {
		t.Fatal(err)
	}
	c := e.consume()
	e.relay()
	e.add(e.msg("marker")) // committed after the rollback
	testenv.Eventually(t, 30*time.Second, "marker consumed", func() bool { return c.count("marker") == 1 })
	e.waitState(outbox.StateSent, 1, 30*time.Second)
	if n := c.count("rolled-back"); n != 0 {
		t.Fatalf("rolled-back message was published %d times", n)
	}
	if m := e.counts(); m[outbox.StatePending]+m[outbox.StateFailed] != 0 {
		t.Fatalf("counts = %v, want only the marker, sent", m)
	}
}

func commitPublished(t *testing.T, s suite) {
	e := setup(t, s)
	c := e.consume()
	var rec idemq.Counters
	e.relay(func(c *outbox.RelayConfig) { c.Recorder = &rec })
	var ids []string
	for i := 0; i < 20; i++ {
		m := e.msg(fmt.Sprintf("order-%d", i))
		m.Headers = amqp.Table{"n": int64(i), "s": "x", "f": 1.5, "nested": amqp.Table{"b": true}}
		m.ContentType = "application/json"
		m.Body = []byte(fmt.Sprintf(`{"n":%d}`, i))
		e.add(m)
		ids = append(ids, m.ID)
	}
	testenv.Eventually(t, 30*time.Second, "all 20 consumed", func() bool { return c.hasAll(ids) })
	e.waitState(outbox.StateSent, 20, 30*time.Second)
	for _, d := range c.snapshot() {
		var n int
		if _, err := fmt.Sscanf(d.MessageId, "order-%d", &n); err != nil {
			t.Fatalf("unexpected message %q", d.MessageId)
		}
		if string(d.Body) != fmt.Sprintf(`{"n":%d}`, n) || d.ContentType != "application/json" {
			t.Errorf("%s: body %q content type %q", d.MessageId, d.Body, d.ContentType)
		}
		if d.Headers["n"] != int64(n) || d.Headers["s"] != "x" || d.Headers["f"] != 1.5 {
			t.Errorf("%s: headers %#v", d.MessageId, d.Headers)
		}
		if nt, ok := d.Headers["nested"].(amqp.Table); !ok || nt["b"] != true {
			t.Errorf("%s: nested header %#v", d.MessageId, d.Headers["nested"])
		}
		if d.DeliveryMode != amqp.Persistent {
			t.Errorf("%s: not persistent", d.MessageId)
		}
	}
	if c.total() != 20 {
		t.Fatalf("consumed %d deliveries, want 20 (no duplicates without a crash)", c.total())
	}
	testenv.Eventually(t, 10*time.Second, "published counter", func() bool { return rec.Get(outbox.CountRelayPublished) == 20 })
}

// child runs the helper relay process with the given kill mode and waits
// for it to die.
func (e *env) child(kill string, batch int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperRelayProcess$", "-test.v")
	cmd.Env = testenv.Env(envHelper+"=1", envFlavor+"="+e.s.name, envDSN+"="+e.dsn, envTable+"="+e.table, envKill+"="+kill,
		envBatch+"="+strconv.Itoa(batch))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		e.t.Fatalf("helper relay: want it killed, got err=%v\n%s", err, out)
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		e.t.Fatalf("helper relay did not die by SIGKILL: %v\n%s", err, out)
	}
}

// HelperProcess is the body of TestHelperRelayProcess: in the child (the
// helper environment set) it relays until its kill hook SIGKILLs it.
// [Flavor] names the backend the parent ran.
func HelperProcess[T any](t *testing.T, b sqldbtest.Backend[T]) {
	if os.Getenv(envHelper) != "1" {
		t.Skip("helper process for the outbox crash tests")
	}
	s := newSuite(b, Features{})
	store, _ := s.open(t, os.Getenv(envDSN), os.Getenv(envTable))
	batch, _ := strconv.Atoi(os.Getenv(envBatch))
	die := func() {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // never return into the relay
	}
	var hooks outbox.Hooks
	kill := os.Getenv(envKill)
	switch {
	case kill == "before-mark":
		hooks.BeforeMark = func([]outbox.Row) { die() }
	case strings.HasPrefix(kill, "after-confirms:"):
		n, _ := strconv.ParseInt(strings.TrimPrefix(kill, "after-confirms:"), 10, 64)
		var seen atomic.Int64
		hooks.AfterConfirm = func(outbox.Row) {
			if seen.Add(1) >= n {
				die()
			}
		}
	default:
		t.Fatalf("unknown %s=%q", envKill, kill)
	}
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: testenv.AMQPURL(), Dial: testenv.Dial})
	if err != nil {
		t.Fatal(err)
	}
	r, err := outbox.NewRelay(outbox.RelayConfig{
		Store: store, Publisher: pub, BatchSize: batch, Concurrency: childConcurrency, Lease: childLease, PublishTimeout: childLease * 3 / 4,
		PollInterval: 10 * time.Millisecond, MaxPollInterval: 100 * time.Millisecond, Hooks: hooks,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	_ = r.Run(ctx)
	t.Fatal("helper relay returned without being killed")
}

// dedupConsume feeds every delivery through a dedup store as the consumer's
// guard would, returning (effects applied, duplicates suppressed).
func dedupConsume(t *testing.T, dels []amqp.Delivery) (map[string]int, int) {
	store := dedup.NewMemory(dedup.MemoryConfig{})
	ctx := tctx(t)
	effects := map[string]int{}
	dups := 0
	for i, d := range dels {
		tok := strconv.Itoa(i)
		cl, err := store.Claim(ctx, "outbox:"+d.MessageId, tok, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		switch cl.Result {
		case dedup.Acquired:
			effects[d.MessageId]++
			if err := store.Complete(ctx, "outbox:"+d.MessageId, tok, time.Hour); err != nil {
				t.Fatal(err)
			}
		case dedup.Done:
			dups++
		default:
			t.Fatalf("claim %s: %v", d.MessageId, cl.Result)
		}
	}
	return effects, dups
}

func killBeforeMark(t *testing.T, s suite) {
	testenv.RequireRealBroker(t, "the relay killed runs in a child process, which cannot reach the in-process fake")
	e := setup(t, s)
	c := e.consume()
	ids := e.addN("kbm", 10, 10)
	e.child("before-mark", 50)
	// Every message was confirmed (the hook runs after the confirms), none
	// is marked.
	testenv.Eventually(t, 30*time.Second, "first copies consumed", func() bool { return c.hasAll(ids) })
	if m := e.counts(); m[outbox.StatePending] != 10 {
		t.Fatalf("after the crash: %v, want 10 pending", m)
	}
	e.relay()
	e.waitState(outbox.StateSent, 10, 45*time.Second)
	attempts := map[string]int{}
	for _, r := range rowInfo(t, e.store) {
		attempts[r.MessageID] = r.Attempts
	}
	testenv.Eventually(t, 30*time.Second, "resends consumed", func() bool {
		for _, id := range ids {
			if c.count(id) < 2 {
				return false
			}
		}
		return true
	})
	for _, id := range ids {
		// Once by the killed relay, once more (same ID) after its lease;
		// never more often than the row was claimed.
		if n := c.count(id); n < 2 || n > attempts[id] {
			t.Errorf("%s consumed %d times, claimed %d times; want 2 <= consumed <= claimed", id, n, attempts[id])
		}
	}
	effects, dups := dedupConsume(t, c.snapshot())
	if len(effects) != 10 || dups != c.total()-10 {
		t.Fatalf("through the dedup guard: %d effects, %d duplicates of %d deliveries; want 10 effects", len(effects), dups, c.total())
	}
	for id, n := range effects {
		if n != 1 {
			t.Fatalf("%s applied %d times", id, n)
		}
	}
}

func killMidBatch(t *testing.T, s suite) {
	testenv.RequireRealBroker(t, "the relay killed runs in a child process, which cannot reach the in-process fake")
	e := setup(t, s)
	c := e.consume()
	ids := e.addN("kmb", 200, 25)
	e.child("after-confirms:20", childBatch)
	e.relay()
	e.waitState(outbox.StateSent, 200, 45*time.Second)
	testenv.Eventually(t, 30*time.Second, "all 200 consumed", func() bool { return c.hasAll(ids) })
	// Only rows the killed relay had claimed (attempts 2: its claim and the
	// recovery's) may be published twice; at most its batches in flight.
	attempts := map[string]int{}
	for _, r := range rowInfo(t, e.store) {
		attempts[r.MessageID] = r.Attempts
	}
	dup := 0
	for _, id := range ids {
		n := c.count(id)
		if n > attempts[id] {
			t.Errorf("%s consumed %d times but claimed only %d times", id, n, attempts[id])
		}
		if n > 1 {
			dup++
		}
	}
	if max := childBatch * childConcurrency; dup > max {
		t.Fatalf("%d messages published twice, want at most the killed relay's batches in flight (%d)", dup, max)
	}
	effects, _ := dedupConsume(t, c.snapshot())
	if len(effects) != 200 {
		t.Fatalf("%d distinct effects, want 200", len(effects))
	}
}

func threeRelays(t *testing.T, s suite) {
	e := setup(t, s)
	c := e.consume()
	var recs [3]idemq.Counters
	for i := range recs {
		e.relay(func(c *outbox.RelayConfig) { c.BatchSize = 20; c.Recorder = &recs[i] })
	}
	var ids []string
	for k := 0; k < 6; k++ {
		ids = append(ids, e.addN(fmt.Sprintf("three-%d", k), 50, 10)...)
	}
	e.waitState(outbox.StateSent, 300, 45*time.Second)
	testenv.Eventually(t, 30*time.Second, "all 300 consumed", func() bool { return c.hasAll(ids) })
	if c.total() != 300 {
		t.Fatalf("consumed %d deliveries for 300 rows: a row was published twice without a crash", c.total())
	}
	// Each relay counts after its mark returns: wait for the last counts.
	var sum int64
	busy := 0
	testenv.Eventually(t, 10*time.Second, "relays count 300 published", func() bool {
		sum, busy = 0, 0
		for i := range recs {
			n := recs[i].Get(outbox.CountRelayPublished)
			sum += n
			if n > 0 {
				busy++
			}
		}
		return sum == 300
	})
	t.Logf("relays that published: %d of 3", busy)
}

func orderingPerKey(t *testing.T, s suite) {
	e := setup(t, s)
	c := e.consume()
	const keys, per = 5, 20
	for i := 0; i < per; i++ {
		var batch []outbox.Message
		for k := 0; k < keys; k++ {
			m := e.msg(fmt.Sprintf("k%d-%02d", k, i))
			m.OrderingKey = fmt.Sprintf("key-%d", k)
			batch = append(batch, m)
		}
		// One unkeyed message per round: never held back.
		batch = append(batch, e.msg(fmt.Sprintf("free-%02d", i)))
		e.add(batch...)
	}
	relays := 2
	if s.f.SingleRelay {
		relays = 1
	}
	for i := 0; i < relays; i++ {
		e.relay(func(c *outbox.RelayConfig) { c.Ordered = true; c.BatchSize = 7 })
	}
	total := keys*per + per
	e.waitState(outbox.StateSent, int64(total), 45*time.Second)
	testenv.Eventually(t, 30*time.Second, "all consumed", func() bool { return c.total() >= total })
	next := map[int]int{}
	for _, d := range c.snapshot() {
		var k, i int
		if _, err := fmt.Sscanf(d.MessageId, "k%d-%d", &k, &i); err != nil {
			continue
		}
		if i != next[k] {
			t.Fatalf("key %d: got sequence %d, want %d (order broken)", k, i, next[k])
		}
		next[k]++
	}
	for k := 0; k < keys; k++ {
		if next[k] != per {
			t.Fatalf("key %d: %d messages in order, want %d", k, next[k], per)
		}
	}
}

// failingPublisher fails every publish of one message ID (a stand-in for a
// message the broker keeps refusing); the rest go to the real publisher.
type failingPublisher struct {
	idemq.Sender
	id string
}

func (f failingPublisher) Publish(ctx context.Context, m idemq.Message) error {
	if m.ID == f.id {
		return errors.New("injected publish failure")
	}
	return f.Sender.Publish(ctx, m)
}

func unroutable(t *testing.T, s suite) {
	e := setup(t, s)
	c := e.consume()
	lost := e.msg("unroutable-1")
	lost.RoutingKey = "no-queue-" + e.queue
	e.add(lost)
	// Headers that cannot fit the broker's frame size: no retry helps, so
	// the row fails at its first attempt (it used to burn MaxAttempts).
	huge := e.msg("too-large-1")
	huge.Headers = amqp.Table{"x-huge": strings.Repeat("h", 140<<10)}
	e.add(huge)
	e.add(e.msg("keeps-failing"))
	ids := e.addN("ok", 10, 5)
	var rec idemq.Counters
	e.relay(func(cfg *outbox.RelayConfig) {
		cfg.Recorder = &rec
		cfg.MaxAttempts = 3
		cfg.Publisher = failingPublisher{Sender: cfg.Publisher, id: "keeps-failing"}
	})
	testenv.Eventually(t, 30*time.Second, "routable messages consumed", func() bool { return c.hasAll(ids) })
	e.waitState(outbox.StateFailed, 3, 45*time.Second)
	e.waitState(outbox.StateSent, 10, 30*time.Second)
	info := rowInfo(t, e.store)
	for _, r := range info {
		switch r.MessageID {
		case "too-large-1":
			if r.State != outbox.StateFailed || !strings.Contains(r.LastError, "too-large") || r.Attempts != 1 {
				t.Errorf("too-large row: %+v", r)
			}
		case "unroutable-1":
			if r.State != outbox.StateFailed || !strings.Contains(r.LastError, "unroutable") || r.Attempts != 1 {
				t.Errorf("unroutable row: %+v", r)
			}
		case "keeps-failing":
			if r.State != outbox.StateFailed || !strings.Contains(r.LastError, "max-attempts") ||
				!strings.Contains(r.LastError, "injected") || r.Attempts != 3 {
				t.Errorf("failing row: %+v", r)
			}
		}
	}
	// The relay counts a failed row after its UPDATE committed: the rows
	// may be seen failed a moment before the counter moves.
	testenv.Eventually(t, 10*time.Second, "failed counter reaches 3", func() bool { return rec.Get(outbox.CountRelayFailed) >= 3 })
	if got := rec.Get(outbox.CountRelayFailed); got != 3 {
		t.Errorf("failed counter = %d, want 3", got)
	}
}

// orderedFailedBlocks: with Ordered, a row that failed for good (here
// unroutable) holds back the later rows of its ordering key — publishing
// them would silently break the key's order — until an operator retries
// the failed row (it publishes, then its successors) or skips it (its
// successors publish, it stays failed and unpublished). Other keys and
// unkeyed rows are not held back, and the relay reports what is blocked.
func orderedFailedBlocks(t *testing.T, s suite) {
	e := setup(t, s)
	c := e.consume()
	keyed := func(id, key string, routable bool) outbox.Message {
		m := e.msg(id)
		m.OrderingKey = key
		if !routable {
			m.RoutingKey = "later-" + e.queue // no such queue yet: unroutable
		}
		return m
	}
	e.add(keyed("K-1", "K", false), keyed("J-1", "J", false))
	e.add(keyed("K-2", "K", true), keyed("J-2", "J", true), keyed("L-1", "L", true), e.msg("free-1"))
	e.add(keyed("K-3", "K", true), keyed("L-2", "L", true))
	var rec idemq.Counters
	r, _ := e.relay(func(cfg *outbox.RelayConfig) {
		cfg.Ordered = true
		cfg.Recorder = &rec
		cfg.StatsInterval = 50 * time.Millisecond
	})
	testenv.Eventually(t, 30*time.Second, "other keys and unkeyed rows consumed", func() bool {
		return c.hasAll([]string{"L-1", "L-2", "free-1"})
	})
	e.waitState(outbox.StateFailed, 2, 30*time.Second)
	// A row committed after the failures is claimed (in id order) by a
	// claim that would also take K-2 and J-2 were they claimable: once it
	// is sent, they were not.
	e.add(e.msg("marker"))
	testenv.Eventually(t, 30*time.Second, "the marker row sent", func() bool { return rowState(t, e.store, "marker") == outbox.StateSent })
	for _, id := range []string{"K-2", "K-3", "J-2"} {
		if st := rowState(t, e.store, id); st != outbox.StatePending || c.count(id) != 0 {
			t.Fatalf("%s is %s and was consumed %d times while its predecessor of the same ordering key is failed: per-key order broken", id, st, c.count(id))
		}
	}
	// The relay reports the held-back rows: K-2, K-3 and J-2.
	testenv.Eventually(t, 30*time.Second, "the relay to report 3 blocked rows", func() bool {
		return rec.Get(outbox.GaugeBlocked) == 3 && r.Blocked() == 3
	})
	var ops outbox.FailedRows = e.store
	blocked, err := ops.Blocked(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(blocked) != 2 || blocked[0].MessageID != "K-1" || blocked[0].Waiting != 2 || blocked[1].MessageID != "J-1" || blocked[1].Waiting != 1 {
		t.Fatalf("Blocked() = %+v, want K-1 holding 2 rows, J-1 holding 1", blocked)
	}
	kID, jID := blocked[0].FailedID, blocked[1].FailedID
	if err := ops.RetryFailed(tctx(t), jID+1000); !errors.Is(err, outbox.ErrNotFailed) {
		t.Fatalf("RetryFailed of a missing row: %v, want ErrNotFailed", err)
	}

	// Skip J-1: J-2 goes out, J-1 stays failed and unpublished.
	if err := ops.SkipFailed(tctx(t), jID); err != nil {
		t.Fatalf("SkipFailed: %v", err)
	}
	testenv.Eventually(t, 30*time.Second, "J-2 consumed after J-1 was skipped", func() bool { return c.count("J-2") == 1 })
	if st := rowState(t, e.store, "J-1"); st != outbox.StateFailed {
		t.Fatalf("skipped row is %s, want still failed", st)
	}
	if err := ops.SkipFailed(tctx(t), e.rowID("J-2")); !errors.Is(err, outbox.ErrNotFailed) {
		t.Fatalf("SkipFailed of a sent row: %v, want ErrNotFailed", err)
	}
	if st := rowState(t, e.store, "K-2"); st != outbox.StatePending {
		t.Fatalf("K-2 is %s after J-1 was skipped, want still pending", st)
	}

	// Retry K-1 once its queue exists: K-1, K-2, K-3 go out in order.
	ch := testenv.Channel(t)
	later := "later-" + e.queue
	if _, err := ch.QueueDeclare(later, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = testenv.Channel(t).QueueDelete(later, false, false, false) })
	got := make(chan string, 10)
	dels, err := ch.Consume(later, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for d := range dels {
			got <- d.MessageId
		}
	}()
	if err := ops.RetryFailed(tctx(t), kID); err != nil {
		t.Fatalf("RetryFailed: %v", err)
	}
	testenv.Eventually(t, 30*time.Second, "K-1, K-2, K-3 sent after K-1 was retried", func() bool {
		return rowState(t, e.store, "K-3") == outbox.StateSent
	})
	select {
	case id := <-got:
		if id != "K-1" {
			t.Fatalf("retried row delivered as %q", id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the retried row was not delivered")
	}
	testenv.Eventually(t, 30*time.Second, "K-2 and K-3 consumed", func() bool { return c.count("K-2") == 1 && c.count("K-3") == 1 })
	var order []string
	for _, d := range c.snapshot() {
		if strings.HasPrefix(d.MessageId, "K-") {
			order = append(order, d.MessageId)
		}
	}
	if strings.Join(order, ",") != "K-2,K-3" {
		t.Fatalf("key K delivered as %v, want K-2 then K-3", order)
	}
	testenv.Eventually(t, 30*time.Second, "the blocked gauge back to 0", func() bool { return rec.Get(outbox.GaugeBlocked) == 0 })
}

// rowState returns the state of the row with message ID id ("" if none).
func rowState(t *testing.T, s outbox.Store, id string) outbox.State {
	t.Helper()
	for _, r := range rowInfo(t, s) {
		if r.MessageID == id {
			return r.State
		}
	}
	return ""
}

func (e *env) rowID(id string) int64 {
	e.t.Helper()
	for _, r := range rowInfo(e.t, e.store) {
		if r.MessageID == id {
			return r.ID
		}
	}
	e.t.Fatalf("no row %q", id)
	return 0
}

func rowInfo(t *testing.T, s outbox.Store) []outbox.RowInfo {
	t.Helper()
	l, ok := s.(interface {
		Rows(context.Context) ([]outbox.RowInfo, error)
	})
	if !ok {
		t.Fatalf("store %T does not list rows", s)
	}
	rows, err := l.Rows(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func purged(t *testing.T, s suite) {
	e := setup(t, s)
	c := e.consume()
	ids := e.addN("purge", 30, 10)
	var rec idemq.Counters
	e.relay(func(cfg *outbox.RelayConfig) {
		cfg.Retention = 50 * time.Millisecond
		cfg.PurgeInterval = 100 * time.Millisecond
		cfg.PurgeBatch = 7 // several batches
		cfg.Recorder = &rec
	})
	testenv.Eventually(t, 30*time.Second, "all consumed", func() bool { return c.hasAll(ids) })
	// The purger deletes a batch, then counts it: wait for both, the rows
	// and the counter, before checking the count is exact.
	testenv.Eventually(t, 30*time.Second, "sent rows purged and counted", func() bool {
		m, err := e.store.Count(tctx(t))
		return err == nil && m[outbox.StateSent] == 0 && m[outbox.StatePending] == 0 &&
			rec.Get(outbox.CountRelayPurged) >= 30
	})
	if n := rec.Get(outbox.CountRelayPurged); n != 30 {
		t.Fatalf("purged counter = %d, want 30", n)
	}
}

func lagReported(t *testing.T, s suite) {
	e := setup(t, s)
	e.addN("lag", 5, 5)
	testenv.Eventually(t, 30*time.Second, "lag > 0", func() bool {
		st, err := e.store.Stats(tctx(t))
		return err == nil && st.Pending == 5 && st.Lag > 0
	})
	// The relay's lag and pending gauges come down to zero once the
	// backlog is gone.
	var rec idemq.Counters
	r, _ := e.relay(func(cfg *outbox.RelayConfig) { cfg.Recorder = &rec; cfg.StatsInterval = 50 * time.Millisecond })
	e.waitState(outbox.StateSent, 5, 30*time.Second)
	testenv.Eventually(t, 30*time.Second, "lag back to 0", func() bool {
		return r.Lag() == 0 && r.Pending() == 0 && rec.Get(outbox.GaugePending) == 0
	})
}

func shutdownDrains(t *testing.T, s suite) {
	e := setup(t, s)
	c := e.consume()
	ids := e.addN("drain", 300, 50)
	_, stop := e.relay(func(cfg *outbox.RelayConfig) { cfg.BatchSize = 25 })
	testenv.Eventually(t, 30*time.Second, "relay under way", func() bool { return c.total() > 0 })
	stop() // returns once Run has returned
	after := e.counts()
	e.relay()
	e.waitState(outbox.StateSent, 300, 45*time.Second)
	testenv.Eventually(t, 30*time.Second, "all consumed", func() bool { return c.hasAll(ids) })
	if c.total() != 300 {
		t.Fatalf("consumed %d deliveries for 300 rows: the stopped relay left published rows unmarked (counts at stop: %v)", c.total(), after)
	}
}
