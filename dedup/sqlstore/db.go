package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// DB runs the store's statements, each on its own (autocommit): the store
// never opens a transaction. [SQL] adapts a *sql.DB; the postgres package
// adapts a *pgxpool.Pool natively.
type DB interface {
	// Exec runs a statement and returns the number of rows it affected.
	Exec(ctx context.Context, query string, args ...any) (int64, error)
	// QueryRow runs a query expected to return at most one row.
	QueryRow(ctx context.Context, query string, args ...any) Row
}

// Row is one result row. Scan returns [ErrNoRows] when there is none.
type Row interface {
	Scan(dest ...any) error
}

// ErrNoRows is what [Row.Scan] returns when the query returned no row.
// Adapters translate their driver's equivalent into it.
var ErrNoRows = errors.New("sqlstore: no rows")

// SQLDB is the part of *sql.DB (or *sql.Conn) the [SQL] adapter uses.
type SQLDB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// SQL adapts a database/sql handle. The caller keeps owning db (and closes
// it after the store).
func SQL(db SQLDB) DB { return sqlDB{db} }

type sqlDB struct{ db SQLDB }

func (s sqlDB) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := s.db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("rows affected: %w", err)
	}
	return n, nil
}

func (s sqlDB) QueryRow(ctx context.Context, query string, args ...any) Row {
	return sqlRow{s.db.QueryRowContext(ctx, query, args...)}
}

type sqlRow struct{ r *sql.Row }

func (r sqlRow) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return ErrNoRows
	}
	return err
}
