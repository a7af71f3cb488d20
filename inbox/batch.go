package inbox

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/sqldb"
)

// BatchConfig configures a [Batcher]. The zero value is usable.
type BatchConfig struct {
	// Size is the most deliveries in one transaction. Default 50.
	Size int
	// MaxWait is how long the first delivery of a batch waits for the
	// batch to fill before it runs anyway. Default 20ms.
	MaxWait time.Duration
	// Concurrency is the number of workers that can call Handle at once
	// (the consumer's ConsumerConfig.Workers). When that many deliveries
	// are waiting no more can arrive, so the batch runs at once instead of
	// waiting MaxWait. Default 0: what the Batcher suggested to a consumer
	// whose Workers is unset ([Batcher.SuggestWorkers]: 2×Size, at most
	// the prefetch window) when the Batcher is that consumer's
	// Pipeline.Handler; otherwise unknown: wait for Size or MaxWait.
	Concurrency int
}

// Batcher is the batch inbox: an [idemq.Handler] that gathers the
// deliveries handed to it concurrently by the consumer's workers into one
// transaction with one commit. Create it with [Inbox.Batch].
//
// Each Handle call blocks until its batch has committed, then returns nil
// (the consumer acks; its coalescing acker turns the batch into one
// multiple-ack) or that delivery's own error: a handler that failed is
// rolled back, the others still commit, and the failure policy sees only
// the failed delivery. If the commit itself fails, every delivery of the
// batch returns an error (nothing was applied; all are retried).
// Duplicates — rows committed earlier, or a second copy in the same batch —
// are acked without running the handler; a second copy runs only if the
// first copy's handler failed.
//
// A batch first takes a fast path: it inserts all its inbox rows with a
// few multi-row INSERTs (PostgreSQL: one per group, the IDs as one array)
// and runs the handler of each fresh row (with [Inbox.BatchFunc]: the
// batch handler once, with all of them) directly in the transaction. If a handler fails or panics (or a statement fails — a
// deadlock, say — or, on MySQL, some rows already existed), that
// transaction is rolled back and the whole batch runs again in a new one
// with a savepoint per delivery (insert, handler, release), whose
// per-delivery results are the ones returned. A handler can therefore be
// called twice for one delivery in one batch; the first call's work was
// rolled back, which is why a handler must do all its work through tx.
//
// A batch can only grow as large as the number of deliveries handed to it
// at once: run the consumer with Workers >= Size (and Prefetch >= Workers),
// and set Concurrency to Workers so a batch that has every worker runs at
// once. With fewer workers each batch waits MaxWait before it runs. Leaving
// the consumer's Workers and Concurrency unset, with the Batcher as the
// consumer's Pipeline.Handler, does this by itself ([Batcher.SuggestWorkers]).
//
// Deliveries in a batch are processed in (group, message ID) order, not in
// arrival order: concurrent batches then take their inbox-row locks in the
// same order and cannot deadlock on them.
type Batcher[T any] struct {
	ib  *Inbox[T]
	h   HandlerFunc[T]      // Batch: called per delivery
	hb  BatchHandlerFunc[T] // BatchFunc: called per batch
	cfg BatchConfig

	mu  sync.Mutex
	cur *batch[T]

	// suggested is the Concurrency taken from SuggestWorkers when
	// cfg.Concurrency is 0.
	suggested atomic.Int64
}

type batchItem struct {
	ctx       context.Context
	d         *idemq.Delivery
	group, id string
	dup       bool
	err       error
}

type batch[T any] struct {
	items []*batchItem
	full  chan struct{}
	done  chan struct{}
}

// BatchHandlerFunc is the business handler of [Inbox.BatchFunc]: it runs
// inside the batch's transaction tx with the deliveries whose inbox rows
// that transaction inserted (in (group, message ID) order, never empty),
// and must do all its database work through tx — a multi-row statement for
// the whole slice, or a statement per delivery sent as one pipeline (pgx:
// queued in a pgx.Batch, see ExampleInbox_BatchFunc_pipeline), is what
// makes it cheaper than a [HandlerFunc] per delivery, whose statements
// cost a round trip each. It must not commit or roll back tx. ctx is the
// batch's: the first delivery's context without its cancellation.
//
// A nil return commits every delivery of the slice. An error or a panic
// rolls the transaction back and the batch runs again with a savepoint per
// delivery, calling the handler once per delivery with a one-element slice
// (and that delivery's own context), so that the error lands on the
// delivery that caused it and the others still commit. It may therefore be
// called several times for one delivery, the earlier calls' work rolled
// back.
type BatchHandlerFunc[T any] func(ctx context.Context, tx T, ds []*idemq.Delivery) error

// Batch returns a batch inbox running h for each delivery.
func (ib *Inbox[T]) Batch(h HandlerFunc[T], cfg BatchConfig) *Batcher[T] {
	return &Batcher[T]{ib: ib, h: h, cfg: cfg.withDefaults()}
}

// BatchFunc returns a batch inbox running h once per batch with all its
// fresh deliveries (see [BatchHandlerFunc]); batching, duplicates and
// results are as with [Inbox.Batch].
func (ib *Inbox[T]) BatchFunc(h BatchHandlerFunc[T], cfg BatchConfig) *Batcher[T] {
	return &Batcher[T]{ib: ib, hb: h, cfg: cfg.withDefaults()}
}

func (cfg BatchConfig) withDefaults() BatchConfig {
	if cfg.Size <= 0 {
		cfg.Size = 50
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 20 * time.Millisecond
	}
	return cfg
}

var (
	_ idemq.Handler    = (*Batcher[any])(nil)
	_ idemq.WorkerHint = (*Batcher[any])(nil)
)

// Probe is the inbox's [Inbox.Probe] (idemq.Prober): the consumer adds
// it to its breaker's probes.
func (b *Batcher[T]) Probe(ctx context.Context) error { return b.ib.Probe(ctx) }

// DedupWindow implements [idemq.Windowed]: the inbox's Config.Window.
func (b *Batcher[T]) DedupWindow() time.Duration { return b.ib.cfg.Window }

var _ idemq.Prober = (*Batcher[any])(nil)

// SuggestWorkers implements [idemq.WorkerHint]: a batch is only as large
// as the deliveries handed to it at once, so a consumer whose Workers is
// unset runs 2×Size workers (one batch filling while another commits),
// capped at its prefetch window. With Concurrency unset the Batcher then
// takes that number as its Concurrency: a batch holding every worker runs
// at once instead of waiting MaxWait. The consumer asks only when the
// Batcher is its Pipeline.Handler itself (not wrapped).
func (b *Batcher[T]) SuggestWorkers(prefetch int) int {
	w := 2 * b.cfg.Size
	if prefetch > 0 {
		w = min(w, prefetch)
	}
	if b.cfg.Concurrency <= 0 {
		// Shared by several consumers, the first one's: batches then run
		// earlier than they could, never later.
		b.suggested.CompareAndSwap(0, int64(w))
	}
	return w
}

// Handle adds d to the current batch and blocks until that batch is done.
func (b *Batcher[T]) Handle(ctx context.Context, d *idemq.Delivery) error {
	group, id, err := b.ib.key(d)
	if err != nil {
		return err
	}
	it := &batchItem{ctx: ctx, d: d, group: group, id: id}
	limit := b.cfg.Size
	conc := b.cfg.Concurrency
	if conc <= 0 {
		conc = int(b.suggested.Load())
	}
	if conc > 0 && conc < limit {
		limit = conc
	}
	b.mu.Lock()
	leader := b.cur == nil
	if leader {
		b.cur = &batch[T]{full: make(chan struct{}), done: make(chan struct{})}
	}
	bt := b.cur
	bt.items = append(bt.items, it)
	if len(bt.items) >= limit {
		b.cur = nil
		close(bt.full)
	}
	b.mu.Unlock()

	if leader {
		t := time.NewTimer(b.cfg.MaxWait)
		select {
		case <-bt.full:
		case <-t.C:
		}
		t.Stop()
		b.mu.Lock()
		if b.cur == bt {
			b.cur = nil // seal it: later arrivals start the next batch
		}
		b.mu.Unlock()
		b.runGuarded(bt)
	} else {
		<-bt.done
	}
	return it.err
}

// savepoint statements are the same on the three dialects.
const (
	spCreate   = "SAVEPOINT idemq_msg"
	spRollback = "ROLLBACK TO SAVEPOINT idemq_msg"
	spRelease  = "RELEASE SAVEPOINT idemq_msg"
)

// insertChunk is the most inbox rows one multi-row INSERT of the fast path
// writes (3 bind parameters each: far below every dialect's limit).
const insertChunk = 500

// errSomeExist: some rows of the fast path's multi-row INSERT already
// exist, and without INSERT ... RETURNING it cannot say which (MySQL: the
// statement failed with a duplicate key and inserted none).
var errSomeExist = errors.New("some inbox rows already exist")

// runGuarded runs bt and always releases its followers: a panic outside
// the handlers (a driver, say) fails every delivery of the batch (a
// delivery whose row did commit is a duplicate when it comes back) instead
// of leaving the followers blocked for ever.
func (b *Batcher[T]) runGuarded(bt *batch[T]) {
	defer close(bt.done)
	defer func() {
		if v := recover(); v != nil {
			b.ib.log.Error("inbox: batch panicked", "deliveries", len(bt.items), "panic", v)
			failAll(bt.items, fmt.Errorf("inbox: batch panicked: %v", v))
		}
	}()
	b.run(bt)
}

func (b *Batcher[T]) run(bt *batch[T]) {
	items := bt.items
	// Sorted: concurrent batches take their inbox-row locks in the same
	// order, and copies of one key are adjacent.
	sort.SliceStable(items, func(i, j int) bool {
		if items[i].group != items[j].group {
			return items[i].group < items[j].group
		}
		return items[i].id < items[j].id
	})
	// The transaction is the batch's, not one delivery's: it must not die
	// with the first delivery's context.
	ctx := context.WithoutCancel(items[0].ctx)
	b.ib.cfg.Observer.Batch(len(items))
	if err := b.runFast(ctx, items); err != nil {
		b.ib.cfg.Observer.SavepointFallback()
		b.ib.log.Debug("inbox: batch fast path rolled back, running it again with a savepoint per delivery", "deliveries", len(items), "reason", err)
		for _, it := range items {
			it.err, it.dup = nil, false
		}
		b.runSavepoints(ctx, items)
	}
	for _, it := range items {
		if it.err == nil && it.dup {
			// The consumer acks it and counts a duplicate.
			it.err = idemq.Duplicate(idemq.LayerInbox)
		}
	}
}

// failAll gives every item err (nothing of the batch was applied).
func failAll(items []*batchItem, err error) {
	for _, it := range items {
		it.err = err
		it.dup = false
	}
}

// runFast is the optimistic path, for a batch where every handler
// succeeds: one transaction, the inbox rows of the batch's distinct keys in
// a few multi-row INSERTs, the handler of each freshly inserted row run
// directly in the transaction (no savepoints), one commit. A later copy of
// a key in the batch is a duplicate of its first copy, which either
// commits or — its handler failed — sends the batch down the savepoint
// path. It returns nil when the items' results are final (committed, or
// failed as the savepoint path would fail them: at begin or commit), and
// otherwise rolls back and returns why: a handler failed or panicked, a
// statement failed (a deadlock, say), or which rows already existed cannot
// be told (no INSERT ... RETURNING). The caller then runs the batch again
// with [Batcher.runSavepoints].
func (b *Batcher[T]) runFast(ctx context.Context, items []*batchItem) error {
	first := make([]*batchItem, 0, len(items))
	for i, it := range items {
		if i == 0 || it.group != items[i-1].group || it.id != items[i-1].id {
			first = append(first, it)
		}
	}
	start := time.Now()
	result := ResultFailed
	defer func() { b.ib.cfg.Observer.Transaction(PathBatch, result, time.Since(start)) }()
	native, tx, err := b.ib.db.BeginNative(ctx)
	if err != nil {
		failAll(items, Classify(fmt.Errorf("inbox: batch begin: %w", err)))
		return nil
	}
	rollback := func(err error) error {
		if tx.Rollback(ctx) == nil {
			result = ResultRolledBack
		}
		return err
	}
	if err := b.insertRows(ctx, tx, first); err != nil {
		return rollback(err)
	}
	if b.hb != nil {
		fresh := make([]*idemq.Delivery, 0, len(first))
		for _, it := range first {
			if !it.dup {
				fresh = append(fresh, it.d)
			}
		}
		if len(fresh) > 0 {
			if err := b.callBatch(ctx, native, fresh); err != nil {
				return rollback(fmt.Errorf("batch handler of %d messages: %w", len(fresh), err))
			}
		}
	} else {
		for _, it := range first {
			if it.dup {
				continue
			}
			if err := b.call(it, native); err != nil {
				return rollback(fmt.Errorf("handler of message %q: %w", it.id, err))
			}
		}
	}
	for i, it := range items {
		if i > 0 && it.group == items[i-1].group && it.id == items[i-1].id {
			it.dup = true // its first copy committed, or was already there
		}
	}
	if err := tx.Commit(ctx); err != nil {
		failAll(items, Classify(fmt.Errorf("inbox: batch commit: %w", err)))
		return nil
	}
	result = ResultCommitted
	return nil
}

// insertRows inserts the inbox rows of items (distinct keys, sorted) in tx
// with one INSERT per group (PostgreSQL: the IDs as one array parameter) or
// multi-row INSERTs of one group and at most insertChunk rows each, and
// marks dup the items whose row was already there. Without INSERT ...
// RETURNING it returns errSomeExist unless every row was inserted.
func (b *Batcher[T]) insertRows(ctx context.Context, tx sqldb.Tx, items []*batchItem) error {
	st := &b.ib.st
	rows, returning := st.rows, st.rowsReturning != nil
	if returning {
		rows = st.rowsReturning
	}
	array := st.insertArray != nil
	now := b.ib.d.Time(b.ib.cfg.Now())
	var args []any
	var idList []string
	if !array {
		args = make([]any, 0, 3*min(len(items), insertChunk))
	}
	for len(items) > 0 {
		n := 1
		for n < len(items) && (array || n < insertChunk) && items[n].group == items[0].group {
			n++
		}
		chunk := items[:n]
		items = items[n:]
		var q string
		if array {
			idList = idList[:0]
			for _, it := range chunk {
				idList = append(idList, it.id)
			}
			q, args = st.insertArray.SQL, st.insertArray.Args(chunk[0].group, idList, now)
		} else {
			args = args[:0]
			for _, it := range chunk {
				args = append(args, it.group, it.id, now)
			}
			stmt, err := rows.Stmt(n)
			if err != nil {
				return fmt.Errorf("inbox: insert rows: %w", err)
			}
			q, args = stmt.SQL, stmt.Args(args...)
		}
		if !returning {
			got, err := tx.Exec(ctx, q, args...)
			if err != nil {
				if b.ib.isDuplicate(err) {
					return fmt.Errorf("%w: %w", errSomeExist, err)
				}
				return fmt.Errorf("inbox: insert rows: %w", err)
			}
			if got != int64(n) {
				return fmt.Errorf("%w (%d of %d inserted)", errSomeExist, got, n)
			}
			continue
		}
		ids, err := sqldb.Strings(ctx, tx, q, args...)
		if err != nil {
			return fmt.Errorf("inbox: insert rows: %w", err)
		}
		if len(ids) == n {
			continue // all fresh
		}
		fresh := make(map[string]struct{}, len(ids))
		for _, id := range ids {
			fresh[id] = struct{}{}
		}
		for _, it := range chunk {
			if _, ok := fresh[it.id]; !ok {
				it.dup = true
			}
		}
	}
	return nil
}

// runSavepoints runs the batch in one transaction with a savepoint per
// delivery: a failed handler is rolled back to its savepoint alone. A later
// copy of a key finds its first copy's row (a duplicate) unless that one
// was rolled back, and then runs.
func (b *Batcher[T]) runSavepoints(ctx context.Context, items []*batchItem) {
	start := time.Now()
	result := ResultFailed
	defer func() { b.ib.cfg.Observer.Transaction(PathSavepoints, result, time.Since(start)) }()
	native, tx, err := b.ib.db.BeginNative(ctx)
	if err != nil {
		failAll(items, Classify(fmt.Errorf("inbox: batch begin: %w", err)))
		return
	}
	abort := func(err error) {
		_ = tx.Rollback(ctx)
		failAll(items, Classify(fmt.Errorf("inbox: batch aborted, transaction rolled back: %w", err)))
	}
	for _, it := range items {
		if _, err := tx.Exec(ctx, spCreate); err != nil {
			abort(fmt.Errorf("savepoint: %w", err))
			return
		}
		fresh, err := b.ib.insert(ctx, tx, it.group, it.id)
		if err == nil && !fresh {
			it.dup = true
		} else if err == nil {
			err = b.call(it, native)
		}
		if err != nil {
			it.err = err
			if _, rbErr := tx.Exec(ctx, spRollback); rbErr != nil {
				// MySQL rolls the whole transaction back on a deadlock, and
				// takes the savepoints with it.
				abort(fmt.Errorf("rollback to savepoint after %v: %w", err, rbErr))
				return
			}
		}
		if _, err := tx.Exec(ctx, spRelease); err != nil {
			abort(fmt.Errorf("release savepoint: %w", err))
			return
		}
	}
	if err := tx.Commit(ctx); err != nil {
		for _, it := range items {
			if it.err == nil {
				it.err = Classify(fmt.Errorf("inbox: batch commit: %w", err))
			}
			it.dup = false
		}
		return
	}
	result = ResultCommitted
}

// call runs the handler for one delivery (a batch handler with a
// one-element slice), turning a panic into that delivery's error so it
// does not take the rest of the batch down.
func (b *Batcher[T]) call(it *batchItem, tx T) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &idemq.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	if b.hb != nil {
		return b.hb(it.ctx, tx, []*idemq.Delivery{it.d})
	}
	return b.h(it.ctx, tx, it.d)
}

// callBatch runs the batch handler for ds, turning a panic into an error.
func (b *Batcher[T]) callBatch(ctx context.Context, tx T, ds []*idemq.Delivery) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &idemq.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return b.hb(ctx, tx, ds)
}
