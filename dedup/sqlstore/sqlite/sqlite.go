package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"

	"modernc.org/sqlite" // also registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/idemq/idemq/dedup/sqlstore"
)

// DSN returns a modernc.org/sqlite data source name for the database file
// at path with the pragmas the store needs under concurrency:
// busy_timeout(5000) and journal_mode(WAL).
func DSN(path string) string {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_pragma", "journal_mode(WAL)")
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + q.Encode()
}

// OpenDB opens the database file at path with [DSN] and at most one
// connection (see the package documentation). The caller closes it.
func OpenDB(path string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", DSN(path))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	return db, nil
}

// New returns a store on db (opened with the "sqlite" driver, ideally by
// [OpenDB] or with a busy timeout) and, unless cfg.NoMigrate, creates its
// table. The caller keeps owning db.
func New(ctx context.Context, db *sql.DB, cfg sqlstore.Config) (*sqlstore.Store, error) {
	if db == nil {
		return nil, errors.New("sqlite: nil db")
	}
	return sqlstore.Open(ctx, sqlstore.SQL(db), Dialect(), cfg)
}

// ROUND: julianday is a float; truncation could lose a millisecond.
const now = `CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)`

// Dialect returns the SQLite dialect.
func Dialect() sqlstore.Dialect {
	return sqlstore.Dialect{
		Name:         "sqlite",
		Placeholders: sqlstore.Question,
		Quote:        func(id string) string { return `"` + id + `"` },
		Now:          now,
		Migrate: []string{
			`CREATE TABLE IF NOT EXISTS {table} (
	{key}      TEXT PRIMARY KEY,
	state      TEXT NOT NULL CHECK (state IN ('processing', 'done')),
	owner      TEXT NOT NULL DEFAULT '',
	expires_at INTEGER NOT NULL
) WITHOUT ROWID`,
			`CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at)`,
		},
		Claim: `INSERT INTO {table} ({key}, state, owner, expires_at)
VALUES (@key, 'processing', @token, {now} + @lease)
ON CONFLICT ({key}) DO UPDATE
SET state = 'processing', owner = excluded.owner, expires_at = excluded.expires_at
WHERE expires_at <= {now} OR (state = 'processing' AND owner = excluded.owner)
RETURNING 1, state, owner, expires_at - {now}`,
		ClaimReturnsRow: true,
		CompleteLost: `INSERT INTO {table} ({key}, state, owner, expires_at)
VALUES (@key, 'done', '', {now} + @window)
ON CONFLICT ({key}) DO UPDATE
SET state = 'done', owner = '', expires_at = excluded.expires_at
WHERE expires_at <= {now}`,
		Purge:     `DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} WHERE expires_at <= {now} LIMIT @batch)`,
		Retryable: retryable,
	}
}

// retryable reports SQLITE_BUSY and SQLITE_LOCKED (extended codes
// included). The busy timeout covers most lock waits, but SQLite returns
// BUSY at once, without calling the busy handler, where waiting could
// deadlock — for example when several connections to a new database switch
// it to WAL at the same moment. The statement had no effect and may run
// again.
func retryable(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return true
	}
	return false
}
