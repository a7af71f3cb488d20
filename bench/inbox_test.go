package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/sqldb/postgres"
)

// inboxConsume runs the PostgreSQL inbox with a one-row effect per message:
// batch 0 is one transaction per message, otherwise batches of that size.
// The effect is wrapped so that the handler-visible overhead excludes it.
// batchFunc: the batch runs its effect rows as one multi-row INSERT
// (Inbox.BatchFunc) instead of one INSERT per delivery.
func inboxConsume(b *testing.B, r *run, batch int, batchFunc bool) {
	ctx := context.Background()
	pool := benchDB(b, fmt.Sprintf("idemq_bench_inbox_%d", batch))
	if _, err := pool.Exec(ctx, `CREATE TABLE effect (message_id text NOT NULL, amount bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	ib, err := inbox.New(ctx, postgres.Pgx(pool), inbox.Config{})
	if err != nil {
		b.Fatal(err)
	}
	effect := func(ctx context.Context, tx pgx.Tx, d *idemq.Delivery) error {
		sp := spanFrom(ctx)
		if sp != nil {
			sp.start = time.Now()
		}
		_, err := tx.Exec(ctx, `INSERT INTO effect (message_id, amount) VALUES ($1, 1)`, d.MessageID)
		if sp != nil {
			sp.end = time.Now()
		}
		return err
	}
	var rec *idemq.Counters
	if batch == 0 {
		rec = idemqConsume(b, r, consumerOpts{Workers: DedupWorkers}, untimed(ib.Handler(effect)))
		checkOnce(b, r, rec)
		return
	}
	workers := batch * 2
	if workers < DedupWorkers {
		workers = DedupWorkers
	}
	cfg := inbox.BatchConfig{Size: batch, MaxWait: 5 * time.Millisecond, Concurrency: workers}
	var h idemq.Handler = ib.Batch(effect, cfg)
	if batchFunc {
		// The same effect rows, written by one statement per batch. The
		// handler's time is not split from the inbox's: p50/p99 are the
		// whole time in the chain.
		h = ib.BatchFunc(func(ctx context.Context, tx pgx.Tx, ds []*idemq.Delivery) error {
			ids := make([]string, len(ds))
			for i, d := range ds {
				ids[i] = d.MessageID
			}
			_, err := tx.Exec(ctx, `INSERT INTO effect (message_id, amount) SELECT m, 1 FROM unnest($1::text[]) AS u(m)`, ids)
			return err
		}, cfg)
	}
	rec = idemqConsume(b, r, consumerOpts{Workers: workers}, untimed(h))
	checkOnce(b, r, rec)
}

// untimedHandler marks a handler whose own timing is done inside (the inbox
// effect), so idemqConsume's wrapper must not overwrite it.
type untimedHandler struct{ idemq.Handler }

func untimed(h idemq.Handler) idemq.Handler { return untimedHandler{h} }

func BenchmarkInbox(b *testing.B) {
	consumeCase(b, "idemq-inbox-postgres-tx-per-message", 0, func(b *testing.B, r *run) { inboxConsume(b, r, 0, false) })
	for _, size := range []int{10, 50, 100} {
		consumeCase(b, fmt.Sprintf("idemq-inbox-postgres-batch-%d", size), 0, func(b *testing.B, r *run) { inboxConsume(b, r, size, false) })
	}
	consumeCase(b, "idemq-inbox-postgres-batchfunc-50", 0, func(b *testing.B, r *run) { inboxConsume(b, r, 50, true) })
}
