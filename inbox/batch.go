package inbox

import (
	"context"
	"fmt"
	"runtime/debug"
	"sort"
	"sync"
	"time"

	"github.com/idemq/idemq"
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
	// waiting MaxWait. Default 0: unknown, wait for Size or MaxWait.
	Concurrency int
}

// Batcher is the batch inbox: an [idemq.Handler] that gathers the
// deliveries handed to it concurrently by the consumer's workers into one
// transaction, a savepoint per delivery, and one commit. Create it with
// [Inbox.Batch].
//
// Each Handle call blocks until its batch has committed, then returns nil
// (the consumer acks; its coalescing acker turns the batch into one
// multiple-ack) or that delivery's own error: a handler that failed is
// rolled back to its savepoint, the others still commit, and the failure
// policy sees only the failed delivery. If the commit itself fails, every
// delivery of the batch returns an error (nothing was applied; all are
// retried). Duplicates — rows committed earlier, or a second copy in the
// same batch — are acked without running the handler.
//
// A batch can only grow as large as the number of deliveries handed to it
// at once: run the consumer with Workers >= Size (and Prefetch >= Workers),
// and set Concurrency to Workers so a batch that has every worker runs at
// once. With fewer workers each batch waits MaxWait before it runs.
//
// Deliveries in a batch are processed in (group, message ID) order, not in
// arrival order: concurrent batches then take their inbox-row locks in the
// same order and cannot deadlock on them.
type Batcher[T any] struct {
	ib  *Inbox[T]
	h   HandlerFunc[T]
	cfg BatchConfig

	mu  sync.Mutex
	cur *batch[T]
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

// Batch returns a batch inbox running h for each delivery.
func (ib *Inbox[T]) Batch(h HandlerFunc[T], cfg BatchConfig) *Batcher[T] {
	if cfg.Size <= 0 {
		cfg.Size = 50
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 20 * time.Millisecond
	}
	return &Batcher[T]{ib: ib, h: h, cfg: cfg}
}

var _ idemq.Handler = (*Batcher[any])(nil)

// Handle adds d to the current batch and blocks until that batch is done.
func (b *Batcher[T]) Handle(ctx context.Context, d *idemq.Delivery) error {
	group, id, err := b.ib.key(d)
	if err != nil {
		return err
	}
	it := &batchItem{ctx: ctx, d: d, group: group, id: id}
	limit := b.cfg.Size
	if b.cfg.Concurrency > 0 && b.cfg.Concurrency < limit {
		limit = b.cfg.Concurrency
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
		b.run(bt)
		close(bt.done)
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

func (b *Batcher[T]) run(bt *batch[T]) {
	items := bt.items
	sort.SliceStable(items, func(i, j int) bool {
		if items[i].group != items[j].group {
			return items[i].group < items[j].group
		}
		return items[i].id < items[j].id
	})
	drv := b.ib.drv
	// The transaction is the batch's, not one delivery's: it must not die
	// with the first delivery's context.
	ctx := context.WithoutCancel(items[0].ctx)
	failAll := func(err error) {
		for _, it := range items {
			it.err = err
			it.dup = false
		}
	}
	tx, err := drv.Begin(ctx)
	if err != nil {
		failAll(fmt.Errorf("inbox: batch begin: %w", err))
		return
	}
	abort := func(err error) {
		_ = drv.Rollback(ctx, tx)
		failAll(fmt.Errorf("inbox: batch aborted, transaction rolled back: %w", err))
	}
	for _, it := range items {
		if _, err := drv.Exec(ctx, tx, spCreate); err != nil {
			abort(fmt.Errorf("savepoint: %w", err))
			return
		}
		fresh, err := b.ib.insert(ctx, tx, it.group, it.id)
		if err == nil && !fresh {
			it.dup = true
		} else if err == nil {
			err = b.call(it, tx)
		}
		if err != nil {
			it.err = err
			if _, rbErr := drv.Exec(ctx, tx, spRollback); rbErr != nil {
				// MySQL rolls the whole transaction back on a deadlock, and
				// takes the savepoints with it.
				abort(fmt.Errorf("rollback to savepoint after %v: %w", err, rbErr))
				return
			}
		}
		if _, err := drv.Exec(ctx, tx, spRelease); err != nil {
			abort(fmt.Errorf("release savepoint: %w", err))
			return
		}
	}
	if err := drv.Commit(ctx, tx); err != nil {
		for _, it := range items {
			if it.err == nil {
				it.err = fmt.Errorf("inbox: batch commit: %w", err)
			}
			it.dup = false
		}
		return
	}
	for _, it := range items {
		switch {
		case it.err != nil:
		case it.dup:
			idemq.RecorderFrom(it.ctx).Add(idemq.CountDuplicates, 1)
			idemq.MarkOutcomeCounted(it.ctx)
		default:
			idemq.RecorderFrom(it.ctx).Add(idemq.CountProcessed, 1)
			idemq.MarkOutcomeCounted(it.ctx)
		}
	}
}

// call runs the handler for one delivery, turning a panic into that
// delivery's error so it does not take the rest of the batch down.
func (b *Batcher[T]) call(it *batchItem, tx T) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &idemq.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return b.h(it.ctx, tx, it.d)
}
