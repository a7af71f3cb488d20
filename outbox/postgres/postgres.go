package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/outbox"
)

// Config configures a [Store]. The zero value is usable.
type Config struct {
	// Table name, optionally schema-qualified. Default outbox.DefaultTable.
	Table string
	// ListenURL is the connection string for the LISTEN connection. Empty
	// disables LISTEN/NOTIFY (the relay then polls). [Open] sets it.
	ListenURL string
	// Channel is the NOTIFY channel. Default: the table name with dots
	// replaced by underscores.
	Channel string
}

// Store is the PostgreSQL outbox store. It implements outbox.Store and
// outbox.Waker.
type Store struct {
	*outbox.SQLStore
	cfg Config
}

// Open opens a database/sql pool on url with the pgx driver and returns a
// store that also LISTENs on url. Close the store to close the pool.
func Open(url string, cfg Config) (*Store, error) {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return nil, fmt.Errorf("outbox(postgres): open: %w", err)
	}
	if cfg.ListenURL == "" {
		cfg.ListenURL = url
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

// New returns a store on db (a database/sql pool using the pgx driver).
func New(db *sql.DB, cfg Config) (*Store, error) {
	if cfg.Table == "" {
		cfg.Table = outbox.DefaultTable
	}
	if err := outbox.CheckTable(cfg.Table); err != nil {
		return nil, err
	}
	if cfg.Channel == "" {
		cfg.Channel = strings.ReplaceAll(cfg.Table, ".", "_")
	}
	if len(cfg.Channel) > 63 {
		cfg.Channel = cfg.Channel[:63]
	}
	d := outbox.Dialect{
		Name:            "postgres",
		Dollar:          true,
		Now:             "now()",
		NowPlusMillis:   func(ph string) string { return "(now() + (" + ph + "::float8 * interval '1 millisecond'))" },
		AgeSeconds:      func(col string) string { return "EXTRACT(EPOCH FROM (now() - " + col + "))::float8" },
		HeadersIn:       func(ph string) string { return ph + "::jsonb" },
		HeadersOut:      func(col string) string { return col + "::text" },
		SkipLocked:      true,
		UpdateReturning: true,
		IDArray:         true,
		Migrate:         migrate,
		AfterInsert:     "SELECT pg_notify($1, '')",
		AfterInsertArgs: []any{cfg.Channel},
	}
	inner, err := outbox.NewSQLStore(db, d, cfg.Table)
	if err != nil {
		return nil, err
	}
	return &Store{SQLStore: inner, cfg: cfg}, nil
}

// Channel is the NOTIFY channel Add signals on.
func (s *Store) Channel() string { return s.cfg.Channel }

func lockKey(table string) int64 {
	h := fnv.New64a()
	h.Write([]byte("idemq-outbox:" + table))
	return int64(h.Sum64())
}

func indexName(table, suffix string) string {
	_, name, ok := strings.Cut(table, ".")
	if !ok {
		name = table
	}
	return name + "_" + suffix
}

func migrate(ctx context.Context, db *sql.DB, table string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	// Serialise concurrent migrations: CREATE … IF NOT EXISTS alone races
	// on the catalog.
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey(table)); err != nil {
		return err
	}
	stmts := []string{
		`CREATE TABLE IF NOT EXISTS ` + table + ` (
			id           BIGSERIAL PRIMARY KEY,
			message_id   TEXT NOT NULL,
			exchange     TEXT NOT NULL DEFAULT '',
			routing_key  TEXT NOT NULL DEFAULT '',
			content_type TEXT NOT NULL DEFAULT '',
			headers      JSONB,
			body         BYTEA NOT NULL,
			ordering_key TEXT,
			state        TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'failed')),
			attempts     INTEGER NOT NULL DEFAULT 0,
			last_error   TEXT,
			owner        TEXT,
			locked_until TIMESTAMPTZ,
			available_at TIMESTAMPTZ NOT NULL DEFAULT now(),
			created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
			sent_at      TIMESTAMPTZ
		)`,
		`CREATE INDEX IF NOT EXISTS ` + indexName(table, "pending") + ` ON ` + table + ` (id) WHERE state = 'pending'`,
		`CREATE INDEX IF NOT EXISTS ` + indexName(table, "key") + ` ON ` + table + ` (ordering_key, id) WHERE state = 'pending' AND ordering_key IS NOT NULL`,
		`CREATE INDEX IF NOT EXISTS ` + indexName(table, "sent") + ` ON ` + table + ` (sent_at) WHERE state = 'sent'`,
		// Failed rows hold back their ordering key (ordered claims).
		`CREATE INDEX IF NOT EXISTS ` + indexName(table, "failed_key") + ` ON ` + table + ` (ordering_key, id) WHERE state = 'failed' AND ordering_key IS NOT NULL`,
	}
	for _, q := range stmts {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// Listen implements outbox.Waker: LISTEN on a dedicated connection, wake on
// each notification and after every (re)connect. Without a ListenURL it
// returns at once and the relay polls.
func (s *Store) Listen(ctx context.Context, wake func()) error {
	if s.cfg.ListenURL == "" {
		return nil
	}
	fails := 0
	for ctx.Err() == nil {
		err := s.listenOnce(ctx, wake, &fails)
		if ctx.Err() != nil {
			return nil
		}
		_ = backoff.Sleep(ctx, backoff.Policy{Min: 100 * time.Millisecond, Max: 5 * time.Second}.Delay(fails))
		fails++
		_ = err
	}
	return nil
}

func (s *Store) listenOnce(ctx context.Context, wake func(), fails *int) error {
	conn, err := pgx.Connect(ctx, s.cfg.ListenURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.cfg.Channel}.Sanitize()); err != nil {
		return err
	}
	*fails = 0
	wake() // rows committed while we were not listening
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		wake()
	}
}

// Tx adapts a pgx.Tx (or pgx.Conn, pgxpool.Pool …) to outbox.Execer, so
//
//	store.Add(ctx, postgres.Tx(tx), msg)
//
// adds to the outbox inside a pgx transaction.
func Tx(tx PgxExecer) outbox.Execer { return pgxExecer{tx} }

// PgxExecer is the part of pgx.Tx that Add uses.
type PgxExecer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

type pgxExecer struct{ tx PgxExecer }

func (p pgxExecer) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	tag, err := p.tx.Exec(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgxResult(tag.RowsAffected()), nil
}

type pgxResult int64

func (r pgxResult) LastInsertId() (int64, error) {
	return 0, fmt.Errorf("outbox(postgres): LastInsertId is not supported")
}
func (r pgxResult) RowsAffected() (int64, error) { return int64(r), nil }

var (
	_ outbox.Store = (*Store)(nil)
	_ outbox.Waker = (*Store)(nil)
)
