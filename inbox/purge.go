package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/idemq/idemq/sqldb"
)

// Purge deletes the inbox rows whose Window ended more than olderThan ago
// (0: every row received more than Window ago), batch rows per statement
// (batch <= 0: PurgeBatch), each batch in its own short transaction so it
// never holds locks for long, until none is left. It returns how many rows
// it deleted.
func (ib *Inbox[T]) Purge(ctx context.Context, olderThan time.Duration, batch int) (int64, error) {
	olderThan = max(olderThan, 0)
	if batch <= 0 {
		batch = ib.cfg.PurgeBatch
	}
	cutoff := ib.d.Time(ib.cfg.Now().Add(-ib.cfg.Window - olderThan))
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := ib.purgeOnce(ctx, cutoff, batch)
		total += n
		if err != nil {
			return total, err
		}
		if n < int64(batch) {
			return total, nil
		}
	}
}

func (ib *Inbox[T]) purgeOnce(ctx context.Context, cutoff any, batch int) (int64, error) {
	tx, err := ib.db.Begin(ctx, sqldb.TxOptions{})
	if err != nil {
		return 0, fmt.Errorf("inbox: purge: begin: %w", err)
	}
	n, err := tx.Exec(ctx, ib.st.purge.SQL, ib.st.purge.Args(cutoff, batch)...)
	if err != nil {
		_ = sqldb.Rollback(ctx, tx)
		return 0, fmt.Errorf("inbox: purge: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("inbox: purge: commit: %w", err)
	}
	return n, nil
}

// RunPurger purges rows older than the Window every PurgeInterval until ctx
// is cancelled (then it returns nil). Errors are logged and retried at the
// next tick. Run it in its own goroutine; several processes may run it at
// once (they delete disjoint or already-deleted rows).
func (ib *Inbox[T]) RunPurger(ctx context.Context) error {
	t := time.NewTicker(ib.cfg.PurgeInterval)
	defer t.Stop()
	for {
		n, err := ib.Purge(ctx, 0, ib.cfg.PurgeBatch)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			ib.log.Warn("inbox: purge failed; retrying at the next interval", "err", err)
		} else if n > 0 {
			ib.log.Debug("inbox: purged", "rows", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
