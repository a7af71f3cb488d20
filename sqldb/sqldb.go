package sqldb

import (
	"context"
	"errors"
)

// Querier runs statements: a transaction, a connection or a pool. It is
// what idemq takes where it works inside your transaction; make one with
// [StdTx] (database/sql) or postgres.PgxTx (pgx).
type Querier interface {
	// Exec runs a statement and returns the number of rows it affected.
	Exec(ctx context.Context, query string, args ...any) (int64, error)
	// Query runs a query returning rows; the caller closes them.
	Query(ctx context.Context, query string, args ...any) (Rows, error)
	// QueryRow runs a query expected to return at most one row.
	QueryRow(ctx context.Context, query string, args ...any) Row
}

// Row is one result row. Scan returns an error wrapping [ErrNoRows] when
// there is none.
type Row interface {
	Scan(dest ...any) error
}

// Rows is a result set.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// ErrNoRows is what [Row.Scan] returns (wrapped, with the driver's own
// error) when the query returned no row.
var ErrNoRows = errors.New("sqldb: no rows")

// Tx is a transaction idemq opened.
type Tx interface {
	Querier
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// TxOptions are the options of a transaction idemq opens.
type TxOptions struct {
	// ReadCommitted asks for READ COMMITTED isolation (MySQL's outbox
	// claim: no gap locks). Default: the database's default.
	ReadCommitted bool
}

// DB is a database idemq opens its own transactions on, with its
// dialect. Statements run on it directly are autocommitted. The dialect
// packages make one: postgres.Pgx, postgres.Std, mysql.Std, sqlite.Std.
type DB interface {
	Querier
	// Dialect is the SQL the database speaks.
	Dialect() *Dialect
	// Begin opens a transaction.
	Begin(ctx context.Context, opts TxOptions) (Tx, error)
}

// Native is a [DB] whose transactions are also handed to user code as the
// driver's own type T (pgx.Tx, *sql.Tx): the inbox's handler receives T.
type Native[T any] interface {
	DB
	// BeginNative opens a transaction and returns it both as T and as the
	// [Tx] idemq runs its own statements, commits and rolls back with.
	BeginNative(ctx context.Context) (T, Tx, error)
}

// Rollback rolls tx back with a context that is not cancelled, so a
// transaction is never left open because the caller's context ended.
func Rollback(ctx context.Context, tx Tx) error {
	return tx.Rollback(context.WithoutCancel(ctx))
}

// Strings runs query on q and returns its single text column.
func Strings(ctx context.Context, q Querier, query string, args ...any) ([]string, error) {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
