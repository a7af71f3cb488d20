package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	inboxpg "github.com/idemq/idemq/inbox/postgres"
)

// inboxConsume runs the PostgreSQL inbox with a one-row effect per message:
// batch 0 is one transaction per message, otherwise batches of that size.
func inboxConsume(b *testing.B, queue string, n, batch int) {
	ctx := context.Background()
	pool := benchDB(b, fmt.Sprintf("idemq_bench_inbox_%d", batch))
	if _, err := pool.Exec(ctx, `CREATE TABLE effect (message_id text NOT NULL, amount bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	ib, err := inboxpg.New(ctx, pool, inbox.Config{})
	if err != nil {
		b.Fatal(err)
	}
	effect := func(ctx context.Context, tx pgx.Tx, d *idemq.Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO effect (message_id, amount) VALUES ($1, 1)`, d.MessageID)
		return err
	}
	if batch == 0 {
		idemqConsumeWorkers(b, queue, n, DedupWorkers, ib.Handler(effect))
		return
	}
	workers := batch * 2
	if workers < DedupWorkers {
		workers = DedupWorkers
	}
	h := ib.Batch(effect, inbox.BatchConfig{Size: batch, MaxWait: 5 * time.Millisecond, Concurrency: workers})
	idemqConsumeWorkers(b, queue, n, workers, h)
}

func BenchmarkInbox(b *testing.B) {
	consumeCase(b, "idemq-inbox-postgres-tx-per-message", func(b *testing.B, queue string, n int) { inboxConsume(b, queue, n, 0) })
	for _, size := range []int{10, 50, 100} {
		consumeCase(b, fmt.Sprintf("idemq-inbox-postgres-batch-%d", size), func(b *testing.B, queue string, n int) { inboxConsume(b, queue, n, size) })
	}
}
