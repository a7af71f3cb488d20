package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strings"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/idemq/idemq/outbox"
)

// Config configures a [Store]. The zero value is usable.
type Config struct {
	// Table name. Default outbox.DefaultTable.
	Table string
}

// Store is the SQLite outbox store; it implements outbox.Store.
type Store struct {
	*outbox.SQLStore
}

// DSN turns a file path into a modernc DSN with WAL, a busy timeout and
// immediate transactions (so a claim never upgrades a read lock and fails
// with SQLITE_BUSY). A path that already has a query string is kept as is.
func DSN(path string) string {
	if strings.Contains(path, "?") {
		return path
	}
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode()
}

// Open opens the database file at path (see [DSN]). Close the store to close
// the pool.
func Open(path string, cfg Config) (*Store, error) {
	db, err := sql.Open("sqlite", DSN(path))
	if err != nil {
		return nil, fmt.Errorf("outbox(sqlite): open: %w", err)
	}
	s, err := New(db, cfg)
	if err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the database pool.
func (s *Store) Close() error { return s.DB.Close() }

const nowExpr = "strftime('%Y-%m-%d %H:%M:%f', 'now')"

// New returns a store on db (a database/sql pool with the sqlite driver).
func New(db *sql.DB, cfg Config) (*Store, error) {
	d := outbox.Dialect{
		Name: "sqlite",
		Now:  nowExpr,
		NowPlusMillis: func(ph string) string {
			return "strftime('%Y-%m-%d %H:%M:%f', 'now', (" + ph + " / 1000.0) || ' seconds')"
		},
		AgeSeconds: func(col string) string { return "((julianday('now') - julianday(" + col + ")) * 86400.0)" },
		Migrate:    migrate,
	}
	inner, err := outbox.NewSQLStore(db, d, cfg.Table)
	if err != nil {
		return nil, err
	}
	if strings.Contains(cfg.Table, ".") {
		return nil, fmt.Errorf("%w: %q: SQLite tables here are not schema-qualified", outbox.ErrInvalidTable, cfg.Table)
	}
	return &Store{SQLStore: inner}, nil
}

func migrate(ctx context.Context, db *sql.DB, table string) error {
	tx, err := db.BeginTx(ctx, nil) // immediate: the write lock serialises migrations
	if err != nil {
		return err
	}
	defer tx.Rollback()
	stmts := []string{
		`CREATE TABLE IF NOT EXISTS ` + table + ` (
			id           INTEGER PRIMARY KEY AUTOINCREMENT,
			message_id   TEXT NOT NULL,
			exchange     TEXT NOT NULL DEFAULT '',
			routing_key  TEXT NOT NULL DEFAULT '',
			content_type TEXT NOT NULL DEFAULT '',
			headers      TEXT,
			body         BLOB NOT NULL,
			ordering_key TEXT,
			state        TEXT NOT NULL DEFAULT 'pending',
			attempts     INTEGER NOT NULL DEFAULT 0,
			last_error   TEXT,
			owner        TEXT,
			locked_until TEXT,
			available_at TEXT NOT NULL DEFAULT (` + nowExpr + `),
			created_at   TEXT NOT NULL DEFAULT (` + nowExpr + `),
			sent_at      TEXT
		)`,
		`CREATE INDEX IF NOT EXISTS ` + table + `_pending ON ` + table + ` (id) WHERE state = 'pending'`,
		`CREATE INDEX IF NOT EXISTS ` + table + `_key ON ` + table + ` (ordering_key, id) WHERE state = 'pending' AND ordering_key IS NOT NULL`,
		`CREATE INDEX IF NOT EXISTS ` + table + `_sent ON ` + table + ` (sent_at) WHERE state = 'sent'`,
		// Failed rows hold back their ordering key (ordered claims).
		`CREATE INDEX IF NOT EXISTS ` + table + `_failed_key ON ` + table + ` (ordering_key, id) WHERE state = 'failed' AND ordering_key IS NOT NULL`,
	}
	for _, q := range stmts {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return tx.Commit()
}

var _ outbox.Store = (*Store)(nil)
