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

// handleAll calls b.Handle for each delivery concurrently (as the
// consumer's workers do) and returns the results by message ID.
// serve runs h on d and does with the outcome what the consumer does:
// counts a processed delivery (nil) or a duplicate (idemq.ErrDuplicate,
// acked: nil) into the context's recorder.
func serve(ctx context.Context, h idemq.Handler, d *idemq.Delivery) error {
	err := h.Handle(ctx, d)
	switch {
	case err == nil:
		idemq.RecorderFrom(ctx).Add(idemq.CountProcessed, 1)
	case idemq.IsDuplicate(err):
		idemq.RecorderFrom(ctx).Add(idemq.CountDuplicates, 1)
		return nil
	}
	return err
}

func handleAll(ctx context.Context, b idemq.Handler, ds ...*idemq.Delivery) []error {
	errs := make([]error, len(ds))
	var wg sync.WaitGroup
	for i, d := range ds {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = serve(ctx, b, d) }()
	}
	wg.Wait()
	return errs
}

func testBatch[T any](t *testing.T, h sqldbtest.Backend[T]) {
	e := setup(t, h)
	good := ids("b", 4)
	e.accounts(append(good, "poison-1", "panic-1")...)
	ib := newInbox(t, e.db.DB, inbox.Config{})
	var rec idemq.Counters
	ctx := idemq.WithRecorder(ctxT(t), &rec)
	hf := func(ctx context.Context, tx T, d *idemq.Delivery) error {
		if d.MessageID == "panic-1" {
			panic("handler bug")
		}
		return effect(e.db)(ctx, tx, d)
	}
	// MaxWait is long: the batch runs because it is full, so all seven
	// deliveries share one transaction.
	b := ib.Batch(hf, inbox.BatchConfig{Size: 7, MaxWait: time.Minute})
	ds := []*idemq.Delivery{delivery(good[0]), delivery(good[1]), delivery("poison-1"), delivery(good[2]), delivery(good[0]), delivery("panic-1"), delivery(good[3])}
	errs := handleAll(ctx, b, ds...)
	for i, d := range ds {
		switch d.MessageID {
		case "poison-1":
			if !idemq.IsPermanent(errs[i]) {
				t.Errorf("poison: %v, want its own permanent error", errs[i])
			}
		case "panic-1":
			var pe *idemq.PanicError
			if !errors.As(errs[i], &pe) {
				t.Errorf("panic: %v, want a PanicError", errs[i])
			}
		default:
			if errs[i] != nil {
				t.Errorf("%s: %v", d.MessageID, errs[i])
			}
		}
	}
	e.wantBalances(Amount, good...)
	e.wantBalances(0, "poison-1", "panic-1")
	if p, d := rec.Get(idemq.CountProcessed), rec.Get(idemq.CountDuplicates); p != 4 || d != 1 {
		t.Fatalf("processed=%d duplicates=%d, want 4 and 1", p, d)
	}
	if n := e.inboxRows(inbox.DefaultTable); n != 4 {
		t.Fatalf("%d inbox rows, want 4 (poison and panic rolled back)", n)
	}
	// A second batch: committed IDs are duplicates, the rest run; a batch
	// that never fills runs after MaxWait.
	b2 := ib.Batch(hf, inbox.BatchConfig{Size: 100, MaxWait: 50 * time.Millisecond})
	for _, err := range handleAll(ctx, b2, delivery(good[0]), delivery(good[3])) {
		if err != nil {
			t.Fatal(err)
		}
	}
	e.wantBalances(Amount, good...)
	// Concurrency caps the batch: with 2 workers a batch of 2 runs at once.
	b3 := ib.Batch(hf, inbox.BatchConfig{Size: 100, MaxWait: time.Hour, Concurrency: 2})
	e.accounts("b-x", "b-y")
	for _, err := range handleAll(ctx, b3, delivery("b-x"), delivery("b-y")) {
		if err != nil {
			t.Fatal(err)
		}
	}
	e.wantBalances(Amount, "b-x", "b-y")

	// Concurrency unset, the Batcher the consumer's handler: the consumer
	// takes the Batcher's suggestion for its Workers (two batches' worth,
	// at most its prefetch window), and the Batcher takes it as its
	// Concurrency.
	for _, tc := range []struct{ size, prefetch, workers, want int }{
		{0, 0, 0, 100}, // the defaults: Size 50, Prefetch 200
		{50, 60, 0, 60},
		{1, 0, 0, 4},  // never below the consumer's default
		{50, 0, 7, 7}, // Workers set wins
	} {
		c, err := idemq.NewConsumer(idemq.ConsumerConfig{Queue: "q", Prefetch: tc.prefetch, Workers: tc.workers,
			Pipeline: idemq.Pipeline{Handler: ib.Batch(hf, inbox.BatchConfig{Size: tc.size})}})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Config().Workers; got != tc.want {
			t.Errorf("Size %d, Prefetch %d, Workers %d: the consumer runs %d workers, want %d", tc.size, tc.prefetch, tc.workers, got, tc.want)
		}
	}
	b4 := ib.Batch(hf, inbox.BatchConfig{Size: 100, MaxWait: time.Hour})
	if got := b4.SuggestWorkers(3); got != 3 {
		t.Fatalf("SuggestWorkers(3) = %d, want 3 (the prefetch window)", got)
	}
	e.accounts("b-s1", "b-s2", "b-s3")
	done := make(chan []error, 1)
	go func() { done <- handleAll(ctx, b4, delivery("b-s1"), delivery("b-s2"), delivery("b-s3")) }()
	select {
	case errs := <-done:
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	case <-time.After(wait):
		t.Fatalf("a batch holding all 3 suggested workers still waiting after %v (MaxWait is an hour)", wait)
	}
	e.wantBalances(Amount, "b-s1", "b-s2", "b-s3")
}

// testBatchFunc: a batch handler runs once with every fresh delivery of the
// batch (not the duplicates: a row committed earlier, a second copy); when
// it fails for one delivery the batch runs again with a savepoint per
// delivery, the handler called with each delivery alone, so only that one
// fails and the others commit.
func testBatchFunc[T any](t *testing.T, h sqldbtest.Backend[T]) {
	e := setup(t, h)
	good := ids("bf", 4)
	e.accounts(append(good, "poison-bf")...)
	ib := newInbox(t, e.db.DB, inbox.Config{})
	var mu sync.Mutex
	var calls [][]string
	hf := func(ctx context.Context, tx T, ds []*idemq.Delivery) error {
		var got []string
		for _, d := range ds {
			got = append(got, d.MessageID)
		}
		mu.Lock()
		calls = append(calls, got)
		mu.Unlock()
		for _, d := range ds {
			if err := effect(e.db)(ctx, tx, d); err != nil {
				return err
			}
		}
		return nil
	}
	ctx := ctxT(t)
	// Fresh IDs and a second copy of one: one call, each ID once.
	b := ib.BatchFunc(hf, inbox.BatchConfig{Size: 3, MaxWait: time.Minute})
	ds := []*idemq.Delivery{delivery(good[2]), delivery(good[1]), delivery(good[2])}
	for i, err := range handleAll(ctx, b, ds...) {
		if err != nil {
			t.Fatalf("%s: %v", ds[i].MessageID, err)
		}
	}
	if want := good[1] + "," + good[2]; len(calls) != 1 || strings.Join(calls[0], ",") != want {
		t.Fatalf("batch handler calls %q, want one call with %s", calls, want)
	}
	// An ID committed earlier is a duplicate the handler never sees (on
	// MySQL, which cannot tell which rows of the multi-row INSERT exist,
	// the batch runs with a savepoint per delivery).
	calls = nil
	b = ib.BatchFunc(hf, inbox.BatchConfig{Size: 2, MaxWait: time.Minute})
	for _, err := range handleAll(ctx, b, delivery(good[1]), delivery(good[3])) {
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(calls) == 0 {
		t.Fatal("batch handler not called")
	}
	for _, c := range calls {
		if strings.Join(c, ",") != good[3] {
			t.Fatalf("batch handler calls %q, want only %s (%s is a duplicate)", calls, good[3], good[1])
		}
	}
	e.wantBalances(Amount, good[1:]...)
	e.wantBalances(0, good[0])

	// A failure in the batch: the handler runs again per delivery.
	calls = nil
	e.accounts("bf-x", "bf-y")
	b = ib.BatchFunc(hf, inbox.BatchConfig{Size: 3, MaxWait: time.Minute})
	ds = []*idemq.Delivery{delivery("bf-x"), delivery("poison-bf"), delivery("bf-y")}
	errs := handleAll(ctx, b, ds...)
	for i, d := range ds {
		if d.MessageID == "poison-bf" {
			if !idemq.IsPermanent(errs[i]) {
				t.Errorf("poison: %v, want its own permanent error", errs[i])
			}
		} else if errs[i] != nil {
			t.Errorf("%s: %v", d.MessageID, errs[i])
		}
	}
	if len(calls) != 4 || len(calls[0]) != 3 || len(calls[1]) != 1 || len(calls[2]) != 1 || len(calls[3]) != 1 {
		t.Fatalf("batch handler calls %q, want the whole batch then each delivery alone", calls)
	}
	e.wantBalances(Amount, "bf-x", "bf-y")
	e.wantBalances(0, "poison-bf")
}

// wrapped is the base of the suite's fault-injecting databases: it embeds
// the database under test and wraps the transactions it begins with wrap.
type wrapped[T any] struct {
	sqldb.Native[T]
	wrap func(sqldb.Tx) sqldb.Tx
}

func (w wrapped[T]) BeginNative(ctx context.Context) (T, sqldb.Tx, error) {
	n, tx, err := w.Native.BeginNative(ctx)
	if err != nil {
		return n, nil, err
	}
	return n, w.wrap(tx), nil
}

// txHook is a transaction whose Commit runs commit instead.
type txHook struct {
	sqldb.Tx
	commit func(ctx context.Context, tx sqldb.Tx) error
}

func (h txHook) Commit(ctx context.Context) error { return h.commit(ctx, h.Tx) }

// failCommit rolls back instead of committing and says so.
func failCommit[T any](db sqldb.Native[T]) sqldb.Native[T] {
	return wrapped[T]{db, func(tx sqldb.Tx) sqldb.Tx {
		return txHook{tx, func(ctx context.Context, tx sqldb.Tx) error {
			_ = tx.Rollback(ctx)
			return errCommit
		}}
	}}
}

var errCommit = errors.New("injected commit failure")

func testBatchCommitFails[T any](t *testing.T, h sqldbtest.Backend[T]) {
	e := setup(t, h)
	newInbox(t, e.db.DB, inbox.Config{}) // migrate with the real driver
	ib := newInbox(t, failCommit(e.db.DB), inbox.Config{NoMigrate: true})
	list := ids("f", 3)
	e.accounts(list...)
	b := ib.Batch(effect(e.db), inbox.BatchConfig{Size: 3, MaxWait: time.Minute})
	ds := []*idemq.Delivery{delivery(list[0]), delivery(list[1]), delivery(list[2])}
	for i, err := range handleAll(ctxT(t), b, ds...) {
		if !errors.Is(err, errCommit) {
			t.Errorf("%s: %v, want the commit error", ds[i].MessageID, err)
		}
	}
	e.wantBalances(0, list...)
	if n := e.inboxRows(inbox.DefaultTable); n != 0 {
		t.Fatalf("%d inbox rows after a failed commit", n)
	}
}

// testBatchOutcomes runs one batch per case (Size is the number of
// deliveries: all share one transaction) mixing fresh IDs, IDs committed
// earlier, copies of one ID and failing handlers, and checks each
// delivery's result, each effect applied exactly once, the inbox rows and
// the counters. The handler applies its effect, then fails for the first
// delivery of a failing ID it sees — every time it is called for that
// delivery — so a later copy of that ID must run and commit.
func testBatchOutcomes[T any](t *testing.T, h sqldbtest.Backend[T]) {
	e := setup(t, h)
	ib := newInbox(t, e.db.DB, inbox.Config{})
	boom := errors.New("boom")
	for i, tc := range []struct {
		name      string
		committed []string // IDs committed before the batch, one by one
		batch     []string // the batch's deliveries, by ID, in arrival order
		fail      []string // IDs whose first delivery fails
		// counters after the batch
		processed, duplicates int64
	}{
		{"all fresh", nil, []string{"a", "b", "c", "d"}, nil, 4, 0},
		{"one failure among successes", nil, []string{"a", "b", "c", "d", "e"}, []string{"c"}, 4, 0},
		{"several failures", nil, []string{"d", "a", "b", "c"}, []string{"a", "d"}, 2, 0},
		{"only a failure", nil, []string{"a"}, []string{"a"}, 0, 0},
		{"committed rows mixed with new ones", []string{"b", "d"}, []string{"a", "b", "c", "d", "e"}, nil, 3, 2},
		{"all committed", []string{"a", "b"}, []string{"b", "a"}, nil, 0, 2},
		{"copies in the batch", nil, []string{"b", "a", "b", "c"}, nil, 3, 1},
		{"copies, the first fails", nil, []string{"a", "b", "b", "b", "c"}, []string{"b"}, 3, 1},
		{"copies of a committed row", []string{"a"}, []string{"a", "b", "a"}, nil, 1, 2},
		{"committed, copies and a failure", []string{"a"}, []string{"c", "a", "a", "b", "c"}, []string{"c"}, 2, 2},
		{"committed row and a failure", []string{"b"}, []string{"a", "b", "c"}, []string{"a"}, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := func(id string) string { return fmt.Sprintf("o%d-%s", i, id) }
			failing := map[string]bool{}
			for _, id := range tc.fail {
				failing[key(id)] = true
			}
			copies := map[string]int{}
			for _, id := range tc.batch {
				copies[key(id)]++
			}
			committed := map[string]bool{}
			for _, id := range tc.committed {
				committed[key(id)] = true
			}
			for id := range copies {
				e.accounts(id)
			}
			ctx := ctxT(t)
			for _, id := range tc.committed {
				if err := serve(ctx, ib.Handler(effect(e.db)), delivery(key(id))); err != nil {
					t.Fatalf("commit %s before the batch: %v", id, err)
				}
			}

			var (
				mu    sync.Mutex
				first = map[string]*idemq.Delivery{} // first delivery seen per ID
				calls = map[string]int{}
			)
			hf := func(ctx context.Context, tx T, d *idemq.Delivery) error {
				mu.Lock()
				calls[d.MessageID]++
				if first[d.MessageID] == nil {
					first[d.MessageID] = d
				}
				isFirst := first[d.MessageID] == d
				mu.Unlock()
				if err := effect(e.db)(ctx, tx, d); err != nil {
					return err
				}
				if failing[d.MessageID] && isFirst {
					return fmt.Errorf("%w: %s", boom, d.MessageID)
				}
				return nil
			}
			var rec idemq.Counters
			b := ib.Batch(hf, inbox.BatchConfig{Size: len(tc.batch), MaxWait: time.Minute})
			ds := make([]*idemq.Delivery, len(tc.batch))
			for j, id := range tc.batch {
				ds[j] = delivery(key(id))
			}
			errs := handleAll(idemq.WithRecorder(ctx, &rec), b, ds...)

			failed := map[string]int{}
			for j, d := range ds {
				switch {
				case errs[j] == nil:
				case !errors.Is(errs[j], boom):
					t.Errorf("%s: %v, want nil or its own handler error", d.MessageID, errs[j])
				case first[d.MessageID] != d:
					t.Errorf("%s: a delivery that did not fail got %v", d.MessageID, errs[j])
				default:
					failed[d.MessageID]++
				}
			}
			for id, n := range copies {
				want := 0
				if failing[id] {
					want = 1
				}
				if failed[id] != want {
					t.Errorf("%s: %d deliveries failed, want %d", id, failed[id], want)
				}
				if committed[id] && calls[id] != 0 {
					t.Errorf("%s: handler ran %d times for a row committed before the batch", id, calls[id])
				}
				if len(tc.fail) == 0 && !committed[id] && calls[id] != 1 {
					t.Errorf("%s: handler ran %d times in a batch without failures, want 1", id, calls[id])
				}
				// Exactly once, unless the only copy failed: then never
				// (its effect and its inbox row were rolled back).
				var bal, rows int64 = Amount, 1
				if failing[id] && n == 1 {
					bal, rows = 0, 0
				}
				if got := e.balance(id); got != bal {
					t.Errorf("balance of %s = %d, want %d", id, got, bal)
				}
				if got := e.int("SELECT COUNT(*) FROM idemq_inbox WHERE message_id = "+e.ph(1), id); got != rows {
					t.Errorf("%s: %d inbox rows, want %d", id, got, rows)
				}
			}
			if p, d := rec.Get(idemq.CountProcessed), rec.Get(idemq.CountDuplicates); p != tc.processed || d != tc.duplicates {
				t.Errorf("processed=%d duplicates=%d, want %d and %d", p, d, tc.processed, tc.duplicates)
			}
		})
	}
}

// testBatchConcurrent: two batchers (two consumers, say) handle the same
// IDs at the same time, in batches of different make-up, so batches wait
// on each other's uncommitted inbox rows. Each effect is applied exactly
// once and every other delivery is a duplicate. A delivery whose batch
// failed as a whole (a deadlock MySQL chose to break) is handed again, as
// the consumer's retry would.
func testBatchConcurrent[T any](t *testing.T, h sqldbtest.Backend[T]) {
	e := setup(t, h)
	list := ids("cb", 60)
	e.accounts(list...)
	ib := newInbox(t, e.db.DB, inbox.Config{})
	var rec idemq.Counters
	ctx := idemq.WithRecorder(ctxT(t), &rec)
	cfg := inbox.BatchConfig{Size: 10, Concurrency: 10, MaxWait: 20 * time.Millisecond}
	batchers := []idemq.Handler{ib.Batch(effect(e.db), cfg), ib.Batch(effect(e.db), cfg)}
	var wg sync.WaitGroup
	var retried atomic.Int64
	for k, b := range batchers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pending := make([]*idemq.Delivery, len(list))
			for j := range list {
				id := list[j]
				if k == 1 {
					id = list[len(list)-1-j]
				}
				pending[j] = delivery(id)
			}
			for round := 0; len(pending) > 0 && round < 5; round++ {
				var again []*idemq.Delivery
				for j, err := range handleAll(ctx, b, pending...) {
					if err != nil {
						t.Logf("%s: %v (handed again)", pending[j].MessageID, err)
						again = append(again, pending[j])
					}
				}
				retried.Add(int64(len(again)))
				pending = again
			}
			if len(pending) > 0 {
				t.Errorf("%d deliveries still failing after 5 rounds", len(pending))
			}
		}()
	}
	wg.Wait()
	e.wantBalances(Amount, list...)
	if p, d := rec.Get(idemq.CountProcessed), rec.Get(idemq.CountDuplicates); p != int64(len(list)) || d != int64(len(list)) {
		t.Fatalf("processed=%d duplicates=%d, want %d and %d", p, d, len(list), len(list))
	}
	if n := e.inboxRows(inbox.DefaultTable); n != int64(len(list)) {
		t.Fatalf("%d inbox rows, want %d", n, len(list))
	}
}
