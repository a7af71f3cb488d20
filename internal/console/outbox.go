package console

import (
	"context"

	"github.com/idemq/idemq/outbox"
)

// Outbox is what the console needs of an outbox table. [SQLOutbox] adapts
// the SQL stores; it is the one place that knows their listing API.
type Outbox interface {
	// Stats is the pending backlog and its lag.
	Stats(ctx context.Context) (outbox.Stats, error)
	// Count is the rows in each state.
	Count(ctx context.Context) (map[outbox.State]int64, error)
	// List returns up to limit rows in state, in id order.
	List(ctx context.Context, state outbox.State, limit int) ([]outbox.RowInfo, error)
	// RetryFailed makes failed row id pending again (outbox.ErrNotFailed
	// when it is not failed).
	RetryFailed(ctx context.Context, id int64) error
}

// SQLStore is what [SQLOutbox] needs: the outbox SQL stores'
// (*outbox.SQLStore, embedded by outbox/postgres, mysql and sqlite) stats,
// row listing and failed-row retry.
type SQLStore interface {
	Stats(ctx context.Context) (outbox.Stats, error)
	Count(ctx context.Context) (map[outbox.State]int64, error)
	Rows(ctx context.Context) ([]outbox.RowInfo, error)
	RetryFailed(ctx context.Context, id int64) error
}

// SQLOutbox is the [Outbox] of an outbox SQL store.
func SQLOutbox(s SQLStore) Outbox { return sqlOutbox{s} }

type sqlOutbox struct{ SQLStore }

func (o sqlOutbox) List(ctx context.Context, state outbox.State, limit int) ([]outbox.RowInfo, error) {
	rows, err := o.Rows(ctx)
	if err != nil {
		return nil, err
	}
	out := []outbox.RowInfo{}
	for _, r := range rows {
		if r.State == state {
			out = append(out, r)
			if limit > 0 && len(out) >= limit {
				break
			}
		}
	}
	return out, nil
}
