package inboxtest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/sqldbtest"
)

// Amount is what every test message adds to its account.
const Amount = 10

// wait is the generous deadline of every poll: the CI machine is small and
// shared.
const wait = 45 * time.Second

type testCase[T any] struct {
	name string
	fn   func(*testing.T, sqldbtest.Backend[T])
}

func run[T any](t *testing.T, h sqldbtest.Backend[T], f Features, cases []testCase[T]) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if f.Parallel {
				t.Parallel()
			}
			c.fn(t, h)
		})
	}
}

// Run runs the cases that need the database only.
func Run[T any](t *testing.T, h sqldbtest.Backend[T], f Features) {
	run(t, h, f, []testCase[T]{
		{"Schema", testSchema[T]},
		{"Handler", testHandler[T]},
		{"RejectsBadIDs", testBadIDs[T]},
		{"RowRefusedIsNotDuplicate", testRowRefused[T]},
		{"ConcurrentSameIDCommit", func(t *testing.T, h sqldbtest.Backend[T]) { testConcurrent(t, h, true) }},
		{"ConcurrentSameIDRollback", func(t *testing.T, h sqldbtest.Backend[T]) { testConcurrent(t, h, false) }},
		{"Purge", testPurge[T]},
		{"Batch", testBatch[T]},
		{"BatchCommitFails", testBatchCommitFails[T]},
		{"BatchOutcomes", testBatchOutcomes[T]},
		{"BatchConcurrent", testBatchConcurrent[T]},
		{"BatchFunc", testBatchFunc[T]},
	})
}

// RunBroker runs the end-to-end cases: the inbox behind an idemq.Consumer
// on the real RabbitMQ.
func RunBroker[T any](t *testing.T, h sqldbtest.Backend[T], f Features) {
	run(t, h, f, []testCase[T]{
		{"PublisherResends", testResends[T]},
		{"TwoConsumers", testTwoConsumers[T]},
		{"FailThenSucceed", testFailThenSucceed[T]},
		{"BatchPoison", testBatchPoison[T]},
		{"KilledAfterCommit", testKilled[T]},
		{"DedupFastPath", testFastPath[T]},
		{"SharedID", testSharedID[T]},
	})
}

// env is one test's database.
type env[T any] struct {
	t   testing.TB
	dsn string
	db  dbh[T]
}

func setup[T any](t testing.TB, h sqldbtest.Backend[T]) *env[T] {
	t.Helper()
	dsn := h.NewDatabase(t)
	e := &env[T]{t: t, dsn: dsn, db: open(t, h, dsn)}
	e.exec("CREATE TABLE accounts (id VARCHAR(100) PRIMARY KEY, balance BIGINT NOT NULL)")
	return e
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	t.Cleanup(cancel)
	return ctx
}

func (e *env[T]) ph(n int) string { return e.db.DB.Dialect().Placeholder(n) }

func (e *env[T]) exec(q string, args ...any) {
	e.t.Helper()
	if err := e.db.Exec(context.Background(), q, args...); err != nil {
		e.t.Fatalf("%s: %v", q, err)
	}
}

func (e *env[T]) int(q string, args ...any) int64 {
	e.t.Helper()
	n, err := e.db.QueryInt(context.Background(), q, args...)
	if err != nil {
		e.t.Fatalf("%s: %v", q, err)
	}
	return n
}

// accounts creates one account per ID, balance 0.
func (e *env[T]) accounts(ids ...string) {
	e.t.Helper()
	for _, id := range ids {
		e.exec("INSERT INTO accounts (id, balance) VALUES ("+e.ph(1)+", 0)", "a-"+id)
	}
}

func (e *env[T]) balance(id string) int64 {
	e.t.Helper()
	return e.int("SELECT balance FROM accounts WHERE id = "+e.ph(1), "a-"+id)
}

// wantBalances checks every listed ID's account holds want.
func (e *env[T]) wantBalances(want int64, ids ...string) {
	e.t.Helper()
	for _, id := range ids {
		if got := e.balance(id); got != want {
			e.t.Errorf("balance of %s = %d, want %d (effect applied %d times)", id, got, want, got/Amount)
		}
	}
}

func (e *env[T]) inboxRows(table string) int64 {
	e.t.Helper()
	qt, err := e.db.DB.Dialect().QuoteTable(table)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.int("SELECT COUNT(*) FROM " + qt)
}

// effect is the non-idempotent business handler: body "<id>" adds Amount
// to account "a-<id>". Body "fail" anywhere in it fails after the update.
func effect[T any](db dbh[T]) inbox.HandlerFunc[T] {
	ph := db.DB.Dialect().Placeholder
	return func(ctx context.Context, tx T, d *idemq.Delivery) error {
		n, err := db.Tx(tx).Exec(ctx, "UPDATE accounts SET balance = balance + "+ph(1)+" WHERE id = "+ph(2), Amount, "a-"+string(d.Body))
		if err != nil {
			return err
		}
		if n != 1 {
			return idemq.Permanent(fmt.Errorf("no account a-%s", d.Body))
		}
		if strings.Contains(d.MessageID, "poison") {
			return idemq.Permanent(errors.New("poison message"))
		}
		return nil
	}
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + "-" + strconv.Itoa(i)
	}
	return out
}

func delivery(id string) *idemq.Delivery {
	return &idemq.Delivery{MessageID: id, Body: []byte(id), Group: "g", Queue: "q"}
}

func newInbox[T any](t testing.TB, db sqldb.Native[T], cfg inbox.Config) *inbox.Inbox[T] {
	t.Helper()
	ib, err := inbox.New(ctxT(t), db, cfg)
	if err != nil {
		t.Fatalf("inbox.New: %v", err)
	}
	return ib
}

func testSchema[T any](t *testing.T, h sqldbtest.Backend[T]) {
	e := setup(t, h)
	ctx := ctxT(t)
	// Concurrent, repeated migrations of a custom table all succeed.
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := inbox.New(ctx, e.db.DB, inbox.Config{Table: "custom_inbox"})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent migrate: %v", err)
		}
	}
	if n := e.inboxRows("custom_inbox"); n != 0 {
		t.Fatalf("fresh table has %d rows", n)
	}
	newInbox(t, e.db.DB, inbox.Config{}) // default table
	if n := e.inboxRows(inbox.DefaultTable); n != 0 {
		t.Fatalf("fresh default table has %d rows", n)
	}

	for _, tc := range []struct {
		name string
		cfg  inbox.Config
		want error
	}{
		{"bad table name", inbox.Config{Table: "x; DROP TABLE accounts"}, sqldb.ErrInvalidIdentifier},
		{"quoted table name", inbox.Config{Table: `a"b`}, sqldb.ErrInvalidIdentifier},
		{"window shorter than retry horizon", inbox.Config{Window: time.Hour, RetryHorizon: 2 * time.Hour}, inbox.ErrWindowTooShort},
		{"group too long", inbox.Config{Group: strings.Repeat("g", inbox.MaxGroupLength+1)}, inbox.ErrInvalidGroup},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := inbox.New(ctx, e.db.DB, tc.cfg)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := inbox.New(ctx, e.db.DB, inbox.Config{Window: 3 * time.Hour, RetryHorizon: 2 * time.Hour}); err != nil {
		t.Fatalf("window >= horizon rejected: %v", err)
	}
}

func testHandler[T any](t *testing.T, h sqldbtest.Backend[T]) {
	e := setup(t, h)
	e.accounts("m1", "m2")
	ib := newInbox(t, e.db.DB, inbox.Config{})
	var rec idemq.Counters
	ctx := idemq.WithRecorder(ctxT(t), &rec)

	// First delivery runs; the same ID again is a duplicate, acked (nil)
	// without running the handler.
	hd := ib.Handler(effect(e.db))
	for i := 0; i < 3; i++ {
		if err := serve(ctx, hd, delivery("m1")); err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
	}
	e.wantBalances(Amount, "m1")
	if p, d := rec.Get(idemq.CountProcessed), rec.Get(idemq.CountDuplicates); p != 1 || d != 2 {
		t.Fatalf("processed=%d duplicates=%d, want 1 and 2", p, d)
	}
	// Another group processes the same ID once more: rows are per group.
	other := delivery("m1")
	other.Group = "other"
	if err := serve(ctx, hd, other); err != nil {
		t.Fatal(err)
	}
	e.wantBalances(2*Amount, "m1")

	// A failing handler rolls back its effect and its inbox row: the
	// redelivery runs again.
	boom := errors.New("boom")
	fail := true
	failing := ib.Handler(func(ctx context.Context, tx T, d *idemq.Delivery) error {
		if err := effect(e.db)(ctx, tx, d); err != nil {
			return err
		}
		if fail {
			return idemq.Requeue(time.Second, "test", boom)
		}
		return nil
	})
	err := serve(ctx, failing, delivery("m2"))
	var re *idemq.RequeueError
	if !errors.Is(err, boom) || !errors.As(err, &re) {
		t.Fatalf("handler error not returned unchanged: %v", err)
	}
	e.wantBalances(0, "m2")
	if n := e.int("SELECT COUNT(*) FROM idemq_inbox WHERE message_id = "+e.ph(1), "m2"); n != 0 {
		t.Fatalf("inbox row of a rolled-back delivery survived (%d)", n)
	}
	fail = false
	if err := serve(ctx, failing, delivery("m2")); err != nil {
		t.Fatal(err)
	}
	e.wantBalances(Amount, "m2")

	// A panicking handler rolls back too (the panic goes on up to the
	// consumer's recoverer).
	func() {
		defer func() { _ = recover() }()
		_ = ib.Handler(func(ctx context.Context, tx T, d *idemq.Delivery) error {
			_ = effect(e.db)(ctx, tx, d)
			panic("handler bug")
		}).Handle(ctx, delivery("m1-panic"))
	}()
	if n := e.int("SELECT COUNT(*) FROM idemq_inbox WHERE message_id = "+e.ph(1), "m1-panic"); n != 0 {
		t.Fatal("a panicking handler's inbox row was committed")
	}
}

func testBadIDs[T any](t *testing.T, h sqldbtest.Backend[T]) {
	e := setup(t, h)
	e.accounts("biz-7")
	ran := 0
	run := func(ctx context.Context, tx T, d *idemq.Delivery) error { ran++; return nil }
	plain := newInbox(t, e.db.DB, inbox.Config{}).Handler(run)
	// The consumer decides the ID (ConsumerConfig.ID); byRule applies the
	// same rule to a hand-built delivery. The inbox keys on that value.
	rule := idemq.IDConfig{Extractor: func(d *idemq.Delivery) (string, error) {
		if k := d.HeaderString("order"); k != "" {
			return "order-" + k, nil
		}
		return "", nil
	}}
	byRule := func(d *idemq.Delivery) *idemq.Delivery { rule.Apply(d); return d }
	byHeader := plain
	ctx := ctxT(t)
	for _, tc := range []struct {
		name   string
		h      idemq.Handler
		d      *idemq.Delivery
		reason string
	}{
		{"empty", plain, &idemq.Delivery{Group: "g"}, idemq.ReasonMissingID},
		{"control char", plain, &idemq.Delivery{MessageID: "a\x00b", Group: "g"}, idemq.ReasonInvalidID},
		{"too long", plain, &idemq.Delivery{MessageID: strings.Repeat("x", idemq.MaxIDLength+1), Group: "g"}, idemq.ReasonInvalidID},
		{"bad utf8", plain, &idemq.Delivery{MessageID: "\xff\xfe", Group: "g"}, idemq.ReasonInvalidID},
		{"no group", plain, &idemq.Delivery{MessageID: "x"}, idemq.ReasonInvalidID},
		{"rule finds nothing", byHeader, byRule(&idemq.Delivery{Group: "g"}), idemq.ReasonMissingID},
		{"rule gives bad id", byHeader, byRule(&idemq.Delivery{Group: "g", Headers: amqp.Table{"order": "\n"}}), idemq.ReasonInvalidID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := serve(ctx, tc.h, tc.d)
			var rej *idemq.RejectError
			if !errors.As(err, &rej) || rej.Reason != tc.reason {
				t.Fatalf("got %v, want a reject with reason %s", err, tc.reason)
			}
		})
	}
	if ran != 0 {
		t.Fatalf("handler ran %d times for rejected deliveries", ran)
	}
	if n := e.inboxRows(inbox.DefaultTable); n != 0 {
		t.Fatalf("%d inbox rows written for rejected deliveries", n)
	}
	// The extractor's ID is the key: two messages with different AMQP IDs
	// but one business key run once.
	for _, mid := range []string{"amqp-1", "amqp-2"} {
		d := byRule(&idemq.Delivery{MessageID: mid, Group: "g", Headers: amqp.Table{"order": "7"}})
		if err := serve(ctx, byHeader, d); err != nil {
			t.Fatal(err)
		}
	}
	if ran != 1 {
		t.Fatalf("business-keyed handler ran %d times, want 1", ran)
	}
}

// RefusedID is the message ID the CHECK constraint of
// [testRowRefused]'s inbox table refuses.
const RefusedID = "refused-by-check"

// testRowRefused: an inbox row the database refuses for any reason other
// than a duplicate key (here a CHECK constraint on a user-managed table;
// on MySQL also truncation or charset conversion, see the inbox package documentation) is an
// error for that delivery, which goes to the failure policy. It is never
// taken for a duplicate and acked without running (MySQL's INSERT IGNORE
// turned such errors into "0 rows inserted"), in the single handler and in
// both paths of the batch inbox; the other deliveries of the batch commit.
func testRowRefused[T any](t *testing.T, h sqldbtest.Backend[T]) {
	e := setup(t, h)
	e.accounts(RefusedID, "ok-1", "ok-2", "ok-3")
	const table = "chk_inbox"
	cfg := inbox.Config{Table: table}
	switch e.db.DB.Dialect().Name {
	case sqldb.SQLite: // no ALTER TABLE ... ADD CONSTRAINT: create it whole
		e.exec(`CREATE TABLE chk_inbox (
	group_name  TEXT    NOT NULL,
	message_id  TEXT    NOT NULL,
	received_at INTEGER NOT NULL,
	PRIMARY KEY (group_name, message_id),
	CHECK (message_id <> '` + RefusedID + `'))`)
		cfg.NoMigrate = true
	default:
		newInbox(t, e.db.DB, cfg)
		e.exec("ALTER TABLE " + table + " ADD CONSTRAINT chk_inbox_refuse CHECK (message_id <> '" + RefusedID + "')")
		cfg.NoMigrate = true
	}
	ib := newInbox(t, e.db.DB, cfg)
	var rec idemq.Counters
	ctx := idemq.WithRecorder(ctxT(t), &rec)
	var mu sync.Mutex
	ran := map[string]int{}
	hf := func(ctx context.Context, tx T, d *idemq.Delivery) error {
		mu.Lock()
		ran[d.MessageID]++
		mu.Unlock()
		return effect(e.db)(ctx, tx, d)
	}

	// The single handler.
	if err := serve(ctx, ib.Handler(hf), delivery(RefusedID)); err == nil {
		t.Errorf("single: a delivery whose inbox row the database refused returned nil (acked; handler ran %d times), want an error", ran[RefusedID])
	}
	if err := serve(ctx, ib.Handler(hf), delivery("ok-1")); err != nil {
		t.Fatalf("single ok-1: %v", err)
	}
	if d := rec.Get(idemq.CountDuplicates); d != 0 {
		t.Errorf("single: duplicates=%d, want 0 (a refused row is not a duplicate)", d)
	}

	// The batch inbox: the refused row, a committed ID, a fresh ID and a
	// copy of it. The fast path cannot insert them all; the savepoint path
	// must fail the refused delivery alone.
	b := ib.Batch(hf, inbox.BatchConfig{Size: 5, MaxWait: time.Minute})
	ds := []*idemq.Delivery{delivery("ok-2"), delivery(RefusedID), delivery("ok-1"), delivery("ok-3"), delivery("ok-2")}
	errs := handleAll(ctx, b, ds...)
	for i, d := range ds {
		if d.MessageID == RefusedID {
			if errs[i] == nil {
				t.Errorf("batch: a delivery whose inbox row the database refused returned nil (acked), want an error")
			}
			continue
		}
		if errs[i] != nil {
			t.Errorf("batch %s: %v", d.MessageID, errs[i])
		}
	}
	// A batch of the refused row alone (the fast path's single insert).
	b1 := ib.Batch(hf, inbox.BatchConfig{Size: 1, MaxWait: time.Minute})
	if err := serve(ctx, b1, delivery(RefusedID)); err == nil {
		t.Errorf("batch of one: a delivery whose inbox row the database refused returned nil (acked), want an error")
	}
	e.wantBalances(0, RefusedID)
	e.wantBalances(Amount, "ok-1", "ok-2", "ok-3")
	// Duplicates: ok-1 (committed before the batch) and ok-2's copy.
	if p, d := rec.Get(idemq.CountProcessed), rec.Get(idemq.CountDuplicates); p != 3 || d != 2 {
		t.Errorf("processed=%d duplicates=%d, want 3 and 2 (the refused row counted as neither)", p, d)
	}
	if n := e.inboxRows(table); n != 3 {
		t.Errorf("%d inbox rows, want 3", n)
	}
}

// testConcurrent: two deliveries of one ID at the same time. The second
// blocks on the first's uncommitted row; it is a duplicate only once the
// first commits, and runs if the first rolls back.
func testConcurrent[T any](t *testing.T, h sqldbtest.Backend[T], commit bool) {
	e := setup(t, h)
	e.accounts("c1")
	ib := newInbox(t, e.db.DB, inbox.Config{})
	var rec idemq.Counters
	ctx := idemq.WithRecorder(ctxT(t), &rec)

	started, release := make(chan struct{}), make(chan struct{})
	firstErr := errors.New("first fails")
	first := ib.Handler(func(ctx context.Context, tx T, d *idemq.Delivery) error {
		if err := effect(e.db)(ctx, tx, d); err != nil {
			return err
		}
		close(started)
		<-release
		if !commit {
			return firstErr
		}
		return nil
	})
	var secondRan atomic.Bool
	second := ib.Handler(func(ctx context.Context, tx T, d *idemq.Delivery) error {
		secondRan.Store(true)
		return effect(e.db)(ctx, tx, d)
	})
	res1, res2 := make(chan error, 1), make(chan error, 1)
	go func() { res1 <- serve(ctx, first, delivery("c1")) }()
	select {
	case <-started:
	case err := <-res1:
		t.Fatalf("first delivery ended early: %v", err)
	}
	go func() { res2 <- serve(ctx, second, delivery("c1")) }()
	if e.db.LockWaiters != nil {
		testenv.Eventually(t, wait, "the second delivery to wait on the first's row lock", func() bool {
			n, err := e.db.LockWaiters(ctx)
			return err == nil && n >= 1
		})
	}
	select {
	case err := <-res2:
		t.Fatalf("second delivery finished (%v) while the first was uncommitted", err)
	default:
	}
	if secondRan.Load() {
		t.Fatal("second delivery ran while the first held the row")
	}
	close(release)
	err1 := <-res1
	err2 := <-res2
	if commit {
		if err1 != nil || err2 != nil {
			t.Fatalf("first=%v second=%v, want nil, nil", err1, err2)
		}
		if secondRan.Load() {
			t.Fatal("second delivery ran after the first committed")
		}
		if d := rec.Get(idemq.CountDuplicates); d != 1 {
			t.Fatalf("duplicates=%d, want 1", d)
		}
	} else {
		if !errors.Is(err1, firstErr) || err2 != nil {
			t.Fatalf("first=%v second=%v, want firstErr, nil", err1, err2)
		}
		if !secondRan.Load() {
			t.Fatal("second delivery did not run after the first rolled back")
		}
	}
	e.wantBalances(Amount, "c1")
}

func testPurge[T any](t *testing.T, h sqldbtest.Backend[T]) {
	e := setup(t, h)
	var now atomic.Int64
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now.Store(t0.UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	ib := newInbox(t, e.db.DB, inbox.Config{Window: time.Hour, Now: clock, PurgeInterval: 10 * time.Millisecond, PurgeBatch: 7})
	nop := ib.Handler(func(context.Context, T, *idemq.Delivery) error { return nil })
	ctx := ctxT(t)
	for _, id := range ids("old", 25) {
		if err := serve(ctx, nop, delivery(id)); err != nil {
			t.Fatal(err)
		}
	}
	now.Store(t0.Add(2 * time.Hour).UnixNano())
	for _, id := range ids("new", 5) {
		if err := serve(ctx, nop, delivery(id)); err != nil {
			t.Fatal(err)
		}
	}
	now.Store(t0.Add(2*time.Hour + time.Minute).UnixNano())
	n, err := ib.Purge(ctx, time.Hour, 10)
	if err != nil || n != 25 {
		t.Fatalf("Purge = %d, %v; want 25 rows", n, err)
	}
	if left := e.inboxRows(inbox.DefaultTable); left != 5 {
		t.Fatalf("%d rows left, want 5", left)
	}
	// The background purger removes the rest once they are past the window.
	now.Store(t0.Add(4 * time.Hour).UnixNano())
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ib.RunPurger(pctx) }()
	testenv.Eventually(t, wait, "the purger to empty the inbox", func() bool { return e.inboxRows(inbox.DefaultTable) == 0 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunPurger: %v", err)
	}
}
