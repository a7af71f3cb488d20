// Package postgres is the inbox's PostgreSQL dialect: a pgx driver (the
// handler receives a pgx.Tx from a *pgxpool.Pool or a *pgx.Conn) and the
// database/sql one (pgx/v5/stdlib; the handler receives a *sql.Tx).
//
// It imports pgx and nothing of MySQL or SQLite.
package postgres

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/inbox"
)

// Beginner is what [Pgx] needs: *pgxpool.Pool, *pgx.Conn (or a pgx.Tx, whose
// Begin opens a savepoint).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Pgx returns an inbox driver over pgx: the handler receives a pgx.Tx.
func Pgx(db Beginner) inbox.Driver[pgx.Tx] { return pgxDriver{db: db} }

// SQL returns an inbox driver over database/sql (db opened with the "pgx"
// driver of pgx/v5/stdlib): the handler receives a *sql.Tx.
func SQL(db *sql.DB) inbox.Driver[*sql.Tx] { return inbox.SQL(db, inbox.Postgres) }

// New creates (and migrates) an inbox over a pgx pool or connection.
func New(ctx context.Context, db Beginner, cfg inbox.Config) (*inbox.Inbox[pgx.Tx], error) {
	return inbox.New(ctx, Pgx(db), cfg)
}

// NewSQL creates (and migrates) an inbox over database/sql.
func NewSQL(ctx context.Context, db *sql.DB, cfg inbox.Config) (*inbox.Inbox[*sql.Tx], error) {
	return inbox.New(ctx, SQL(db), cfg)
}

type pgxDriver struct{ db Beginner }

func (pgxDriver) Dialect() inbox.Dialect { return inbox.Postgres }

func (p pgxDriver) Begin(ctx context.Context) (pgx.Tx, error) { return p.db.Begin(ctx) }

func (pgxDriver) Exec(ctx context.Context, tx pgx.Tx, query string, args ...any) (int64, error) {
	tag, err := tx.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// QueryStrings runs query in tx and returns its single text column (the
// batch inbox's INSERT ... RETURNING).
func (pgxDriver) QueryStrings(ctx context.Context, tx pgx.Tx, query string, args ...any) ([]string, error) {
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func (pgxDriver) Commit(ctx context.Context, tx pgx.Tx) error   { return tx.Commit(ctx) }
func (pgxDriver) Rollback(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) }
