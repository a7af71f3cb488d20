package business

import (
	"context"
	"fmt"

	"github.com/idemq/idemq/sqldb"
)

// InsertOnce runs query, an INSERT that skips an existing row
// (INSERT ... ON CONFLICT DO NOTHING on PostgreSQL and SQLite, INSERT IGNORE
// on MySQL), on q — your transaction, handed over the one way:
// sqldb.StdTx(tx) or postgres.PgxTx(tx) — and reports whether it inserted.
// A row that was already there is a success: inserted=false, err=nil. Any
// error is returned wrapped.
//
// Use it for the "create once" effects (createOrder): the redelivered
// message finds the row and moves on. On MySQL prefer a unique key and
// INSERT IGNORE only on strict tables (IGNORE also downgrades other errors
// to warnings); or insert plainly and tell a duplicate with the dialect's
// IsDuplicateKey (postgres.IsDuplicateKey, mysql.IsDuplicateKey,
// sqlite.IsDuplicateKey).
func InsertOnce(ctx context.Context, q sqldb.Querier, query string, args ...any) (inserted bool, err error) {
	n, err := q.Exec(ctx, query, args...)
	if err != nil {
		return false, fmt.Errorf("business: insert once: %w", err)
	}
	return n > 0, nil
}
