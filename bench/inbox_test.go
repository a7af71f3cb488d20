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

// effectMode is how a batch writes its one-row-per-message effect.
type effectMode int

const (
	// perDelivery: Inbox.Batch, one INSERT per delivery, each its own
	// round trip.
	perDelivery effectMode = iota
	// oneStatement: Inbox.BatchFunc, one multi-row INSERT for the batch.
	oneStatement
	// pipelined: Inbox.BatchFunc, one INSERT per delivery queued in a
	// pgx.Batch and sent as one pipeline (one round trip).
	pipelined
)

// inboxConsume runs the PostgreSQL inbox with a one-row effect per message:
// batch 0 is one transaction per message, otherwise batches of that size
// whose effect rows are written as mode says. The effect is wrapped so
// that the handler-visible overhead excludes it.
func inboxConsume(b *testing.B, r *run, batch int, mode effectMode) {
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
	// With BatchFunc the handler's time is not split from the inbox's:
	// p50/p99 are the whole time in the chain.
	switch mode {
	case oneStatement:
		// The same effect rows, written by one statement per batch.
		h = ib.BatchFunc(func(ctx context.Context, tx pgx.Tx, ds []*idemq.Delivery) error {
			ids := make([]string, len(ds))
			for i, d := range ds {
				ids[i] = d.MessageID
			}
			_, err := tx.Exec(ctx, `INSERT INTO effect (message_id, amount) SELECT m, 1 FROM unnest($1::text[]) AS u(m)`, ids)
			return err
		}, cfg)
	case pipelined:
		// The per-delivery statement of perDelivery, queued for every
		// delivery of the batch and sent in one round trip.
		h = ib.BatchFunc(func(ctx context.Context, tx pgx.Tx, ds []*idemq.Delivery) error {
			q := &pgx.Batch{}
			for _, d := range ds {
				q.Queue(`INSERT INTO effect (message_id, amount) VALUES ($1, 1)`, d.MessageID)
			}
			return tx.SendBatch(ctx, q).Close()
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
	consumeCase(b, "idemq-inbox-postgres-tx-per-message", 0, func(b *testing.B, r *run) { inboxConsume(b, r, 0, perDelivery) })
	for _, size := range []int{10, 50, 100} {
		consumeCase(b, fmt.Sprintf("idemq-inbox-postgres-batch-%d", size), 0, func(b *testing.B, r *run) { inboxConsume(b, r, size, perDelivery) })
	}
	consumeCase(b, "idemq-inbox-postgres-batchfunc-50", 0, func(b *testing.B, r *run) { inboxConsume(b, r, 50, oneStatement) })
	consumeCase(b, "idemq-inbox-postgres-batchfunc-pipelined-50", 0, func(b *testing.B, r *run) { inboxConsume(b, r, 50, pipelined) })
}
