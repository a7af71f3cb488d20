package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/idemq/idemq/outbox"
)

// Config configures a [Store]. The zero value is usable.
type Config struct {
	// Table name, optionally database-qualified. Default outbox.DefaultTable.
	Table string
}

// Store is the MySQL/MariaDB outbox store; it implements outbox.Store.
type Store struct {
	*outbox.SQLStore
}

// Open opens a database/sql pool for a go-sql-driver DSN
// ("user:pass@tcp(host:3306)/db"). Close the store to close the pool.
func Open(dsn string, cfg Config) (*Store, error) {
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("outbox(mysql): DSN: %w", err)
	}
	mc.ParseTime = true
	db, err := sql.Open("mysql", mc.FormatDSN())
	if err != nil {
		return nil, fmt.Errorf("outbox(mysql): open: %w", err)
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

// New returns a store on db (a database/sql pool with the mysql driver).
func New(db *sql.DB, cfg Config) (*Store, error) {
	d := outbox.Dialect{
		Name:          "mysql",
		Now:           "NOW(6)",
		NowPlusMillis: func(ph string) string { return "(NOW(6) + INTERVAL (" + ph + " * 1000) MICROSECOND)" },
		AgeSeconds:    func(col string) string { return "(TIMESTAMPDIFF(MICROSECOND, " + col + ", NOW(6)) / 1000000.0)" },
		SkipLocked:    true,
		DeleteLimit:   true,
		// READ COMMITTED: no gap locks, so concurrent claims and inserts do
		// not deadlock on the pending index.
		ClaimTx: &sql.TxOptions{Isolation: sql.LevelReadCommitted},
		Migrate: migrate,
	}
	inner, err := outbox.NewSQLStore(db, d, cfg.Table)
	if err != nil {
		return nil, err
	}
	return &Store{SQLStore: inner}, nil
}

func indexName(table, suffix string) string {
	_, name, ok := strings.Cut(table, ".")
	if !ok {
		name = table
	}
	return name + "_" + suffix
}

func migrate(ctx context.Context, db *sql.DB, table string) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	// Serialise concurrent migrations with a named lock on this connection.
	lock := "idemq-outbox:" + table
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 30)", lock).Scan(&got); err != nil {
		return err
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("could not take the migration lock %q", lock)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK(?)", lock)
	_, err = conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (
		id           BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
		message_id   VARCHAR(255) NOT NULL,
		exchange     VARCHAR(255) NOT NULL DEFAULT '',
		routing_key  VARCHAR(255) NOT NULL DEFAULT '',
		content_type VARCHAR(255) NOT NULL DEFAULT '',
		headers      LONGTEXT NULL,
		body         LONGBLOB NOT NULL,
		ordering_key VARCHAR(255) NULL,
		state        VARCHAR(16) NOT NULL DEFAULT 'pending',
		attempts     INT NOT NULL DEFAULT 0,
		last_error   TEXT NULL,
		owner        VARCHAR(255) NULL,
		locked_until DATETIME(6) NULL,
		available_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
		created_at   DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
		sent_at      DATETIME(6) NULL,
		KEY `+indexName(table, "state")+` (state, id),
		KEY `+indexName(table, "key")+` (ordering_key, state, id),
		KEY `+indexName(table, "sent")+` (state, sent_at)
	) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`)
	return err
}

var _ outbox.Store = (*Store)(nil)
