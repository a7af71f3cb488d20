package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// StdQuerier is the part of *sql.DB, *sql.Conn and *sql.Tx that [StdTx]
// uses.
type StdQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// StdBeginner is what [Std] adapts: *sql.DB or *sql.Conn.
type StdBeginner interface {
	StdQuerier
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// StdTx adapts a database/sql transaction (or any [StdQuerier]) to a
// [Querier]: the one way to hand idemq a *sql.Tx.
func StdTx(tx StdQuerier) Querier { return stdQuerier{tx} }

// Std adapts a database/sql handle speaking dialect d. The dialect
// packages call it (mysql.Std, sqlite.Std, postgres.Std); the caller keeps
// owning db.
func Std(db StdBeginner, d *Dialect) Native[*sql.Tx] { return stdDB{stdQuerier{db}, db, d} }

type stdQuerier struct{ q StdQuerier }

func (s stdQuerier) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := s.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("rows affected: %w", err)
	}
	return n, nil
}

func (s stdQuerier) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	rows, err := s.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return stdRows{rows}, nil
}

func (s stdQuerier) QueryRow(ctx context.Context, query string, args ...any) Row {
	return stdRow{s.q.QueryRowContext(ctx, query, args...)}
}

type stdRow struct{ r *sql.Row }

func (r stdRow) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: %w", ErrNoRows, err)
	}
	return err
}

type stdRows struct{ *sql.Rows }

func (r stdRows) Close() { _ = r.Rows.Close() }

type stdDB struct {
	stdQuerier
	db StdBeginner
	d  *Dialect
}

func (s stdDB) Dialect() *Dialect { return s.d }

func (s stdDB) Begin(ctx context.Context, opts TxOptions) (Tx, error) {
	var o *sql.TxOptions
	if opts.ReadCommitted {
		o = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	tx, err := s.db.BeginTx(ctx, o)
	if err != nil {
		return nil, err
	}
	return stdTx{stdQuerier{tx}, tx}, nil
}

func (s stdDB) BeginNative(ctx context.Context) (*sql.Tx, Tx, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, nil, err
	}
	return tx, stdTx{stdQuerier{tx}, tx}, nil
}

type stdTx struct {
	stdQuerier
	tx *sql.Tx
}

func (t stdTx) Commit(context.Context) error   { return t.tx.Commit() }
func (t stdTx) Rollback(context.Context) error { return t.tx.Rollback() }
