package postgres

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/dedup/sqlstore"
)

// New returns a store on pool and, unless cfg.NoMigrate, creates its table.
// The caller keeps owning pool (close it after the store).
func New(ctx context.Context, pool *pgxpool.Pool, cfg sqlstore.Config) (*sqlstore.Store, error) {
	if pool == nil {
		return nil, errors.New("postgres: nil pool")
	}
	return sqlstore.Open(ctx, Pool(pool), Dialect(), cfg)
}

// NewDB returns a store on db (opened with the "pgx" driver of
// github.com/jackc/pgx/v5/stdlib) and, unless cfg.NoMigrate, creates its
// table. The caller keeps owning db.
func NewDB(ctx context.Context, db *sql.DB, cfg sqlstore.Config) (*sqlstore.Store, error) {
	if db == nil {
		return nil, errors.New("postgres: nil db")
	}
	return sqlstore.Open(ctx, sqlstore.SQL(db), Dialect(), cfg)
}

// Pool adapts a pgx pool to [sqlstore.DB].
func Pool(p *pgxpool.Pool) sqlstore.DB { return poolDB{p} }

type poolDB struct{ p *pgxpool.Pool }

func (p poolDB) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := p.p.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func (p poolDB) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	return pgRow{p.p.QueryRow(ctx, query, args...)}
}

type pgRow struct{ r pgx.Row }

func (r pgRow) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return sqlstore.ErrNoRows
	}
	return err
}

const now = `(extract(epoch FROM statement_timestamp()) * 1000)::bigint`

// Dialect returns the PostgreSQL dialect.
func Dialect() sqlstore.Dialect {
	return sqlstore.Dialect{
		Name:         "postgres",
		Placeholders: sqlstore.Dollar,
		Quote:        func(id string) string { return `"` + id + `"` },
		Now:          now,
		Migrate: []string{`DO $$
BEGIN
	PERFORM pg_advisory_xact_lock({lock});
	CREATE TABLE IF NOT EXISTS {table} (
		{key}      text COLLATE "C" PRIMARY KEY,
		state      text NOT NULL CHECK (state IN ('processing', 'done')),
		owner      text NOT NULL DEFAULT '',
		expires_at bigint NOT NULL
	);
	CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at);
END
$$`},
		Claim: `WITH up AS (
	INSERT INTO {table} AS d ({key}, state, owner, expires_at)
	VALUES (@key, 'processing', @token, {now} + @lease)
	ON CONFLICT ({key}) DO UPDATE
	SET state = 'processing', owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
	WHERE d.expires_at <= {now} OR (d.state = 'processing' AND d.owner = EXCLUDED.owner)
	RETURNING d.state, d.owner, d.expires_at - {now} AS left_ms
)
SELECT 1, state, owner, left_ms FROM up
UNION ALL
SELECT 0, state, owner, expires_at - {now} FROM {table}
WHERE {key} = @key AND NOT EXISTS (SELECT 1 FROM up)`,
		ClaimReturnsRow: true,
		CompleteLost: `INSERT INTO {table} AS d ({key}, state, owner, expires_at)
VALUES (@key, 'done', '', {now} + @window)
ON CONFLICT ({key}) DO UPDATE
SET state = 'done', owner = '', expires_at = EXCLUDED.expires_at
WHERE d.expires_at <= {now}`,
		Purge: `DELETE FROM {table} WHERE {key} IN (
	SELECT {key} FROM {table} WHERE expires_at <= {now} LIMIT @batch FOR UPDATE SKIP LOCKED
) AND expires_at <= {now}`,
		Retryable: retryable,
	}
}

// retryable: serialization failure and deadlock, after which the statement
// was rolled back.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}
