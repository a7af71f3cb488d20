// Package postgres is PostgreSQL for idemq's SQL layer ([sqldb]): its
// [Dialect], the pgx v5 adapter ([Pgx] for a *pgxpool.Pool or *pgx.Conn,
// [PgxTx] for a pgx.Tx) and the database/sql one ([Std], a *sql.DB opened
// with pgx/v5/stdlib's "pgx" driver, which this package registers). It
// imports pgx and no other driver.
//
// The clock is statement_timestamp() (dedup expiries, milliseconds) and
// now() (outbox timestamps); migrations serialise on
// pg_advisory_xact_lock; a unique violation is SQLSTATE 23505; a
// serialization failure (40001) or deadlock (40P01) is retried.
package postgres

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/sqldb"
)

// UniqueViolation is PostgreSQL's SQLSTATE for a duplicate key.
const UniqueViolation = "23505"

// Dialect returns the PostgreSQL dialect.
func Dialect() *sqldb.Dialect {
	return &sqldb.Dialect{
		Name:          sqldb.Postgres,
		Dollar:        true,
		QuoteChar:     `"`,
		Schemas:       true,
		NowMillis:     `(extract(epoch FROM statement_timestamp()) * 1000)::bigint`,
		Now:           "now()",
		NowPlusMillis: func(ms string) string { return "(now() + (" + ms + "::float8 * interval '1 millisecond'))" },
		AgeSeconds:    func(col string) string { return "EXTRACT(EPOCH FROM (now() - " + col + "))::float8" },
		Time:          func(t time.Time) any { return t.UTC() },
		Lock: func(ctx context.Context, tx sqldb.Querier, name string) (func(context.Context), error) {
			_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", sqldb.LockKey(name))
			return nil, err
		},
		DuplicateKey: IsDuplicateKey,
		Retryable: func(err error) bool {
			var pe *pgconn.PgError
			return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
		},
		ConnLost: func(err error) bool {
			var ce *pgconn.ConnectError
			return errors.As(err, &ce)
		},
		Upsert:       sqldb.OnConflict,
		Returning:    true,
		WritableCTE:  true,
		Arrays:       true,
		SkipLocked:   "FOR UPDATE SKIP LOCKED",
		JSONIn:       func(expr string) string { return expr + "::jsonb" },
		JSONOut:      func(col string) string { return col + "::text" },
		Notify:       func(channel string) string { return "SELECT pg_notify(" + channel + ", '')" },
		AsyncCommit:  "set_config('synchronous_commit', 'off', true)",
		NoBitmapScan: "set_config('enable_bitmapscan', 'off', true)",
	}
}

// IsDuplicateKey reports whether err is (or wraps) a unique violation: a
// *pgconn.PgError with code 23505 (pgx and pgx/v5/stdlib alike).
func IsDuplicateKey(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == UniqueViolation
}

// Std adapts a database/sql pool opened with the "pgx" driver. The caller
// keeps owning db.
func Std(db *sql.DB) sqldb.Native[*sql.Tx] { return sqldb.Std(db, Dialect()) }

// PgxQuerier is what [PgxTx] adapts: pgx.Tx (or *pgx.Conn, *pgxpool.Pool).
type PgxQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// PgxConn is what [Pgx] adapts: *pgxpool.Pool or *pgx.Conn.
type PgxConn interface {
	PgxQuerier
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// PgxTx adapts a pgx transaction to a [sqldb.Querier]: the one way to
// hand idemq a pgx.Tx.
func PgxTx(tx PgxQuerier) sqldb.Querier { return pgxQuerier{tx} }

// Pgx adapts a pgx pool or connection (the inbox's handler receives a
// pgx.Tx). The caller keeps owning c.
func Pgx(c PgxConn) sqldb.Native[pgx.Tx] { return pgxDB{pgxQuerier{c}, c, Dialect()} }

type pgxQuerier struct{ q PgxQuerier }

func (p pgxQuerier) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := p.q.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func (p pgxQuerier) Query(ctx context.Context, query string, args ...any) (sqldb.Rows, error) {
	return p.q.Query(ctx, query, args...)
}

func (p pgxQuerier) QueryRow(ctx context.Context, query string, args ...any) sqldb.Row {
	return pgxRow{p.q.QueryRow(ctx, query, args...)}
}

type pgxRow struct{ r pgx.Row }

func (r pgxRow) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return errors.Join(sqldb.ErrNoRows, err)
	}
	return err
}

type pgxDB struct {
	pgxQuerier
	c PgxConn
	d *sqldb.Dialect
}

func (p pgxDB) Dialect() *sqldb.Dialect { return p.d }

func (p pgxDB) Begin(ctx context.Context, opts sqldb.TxOptions) (sqldb.Tx, error) {
	var o pgx.TxOptions
	if opts.ReadCommitted {
		o.IsoLevel = pgx.ReadCommitted
	}
	tx, err := p.c.BeginTx(ctx, o)
	if err != nil {
		return nil, err
	}
	return pgxTx{pgxQuerier{tx}, tx}, nil
}

func (p pgxDB) BeginNative(ctx context.Context) (pgx.Tx, sqldb.Tx, error) {
	tx, err := p.c.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return nil, nil, err
	}
	return tx, pgxTx{pgxQuerier{tx}, tx}, nil
}

type pgxTx struct {
	pgxQuerier
	tx pgx.Tx
}

func (t pgxTx) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgxTx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

// Listener returns a function that LISTENs on channel over its own
// connection to url and calls wake (which must not block) for each
// notification and after every (re)connect, reconnecting with backoff
// until ctx is done (then it returns nil). The outbox relay uses it
// (outbox.Config.Listen) to publish as soon as a row commits.
func Listener(url string) func(ctx context.Context, channel string, wake func()) error {
	return func(ctx context.Context, channel string, wake func()) error {
		fails := 0
		for ctx.Err() == nil {
			_ = listenOnce(ctx, url, channel, wake, &fails)
			if ctx.Err() != nil {
				break
			}
			_ = backoff.Sleep(ctx, backoff.Policy{Min: 100 * time.Millisecond, Max: 5 * time.Second}.Delay(fails))
			fails++
		}
		return nil
	}
}

func listenOnce(ctx context.Context, url, channel string, wake func(), fails *int) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	*fails = 0
	wake() // rows committed while nobody listened
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		wake()
	}
}
