package inboxtest

// The batch inbox's cases (inbox.Batcher): one transaction for several
// deliveries, its outcomes per delivery, a failed commit, concurrent
// batches. The single-delivery cases are in suite.go.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/sqldbtest"
)

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

// handleAll calls b.Handle for each delivery concurrently (as the
// consumer's workers do) and returns the results by message ID.
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
