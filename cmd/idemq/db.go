package main

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/mysql"
	"github.com/idemq/idemq/sqldb/postgres"
	"github.com/idemq/idemq/sqldb/sqlite"
)

// connect resolves --db and --dialect and opens the database: the
// command's context, the resolved database, the handle and its closer.
func connect(cmd *cobra.Command, dbFlag, dialect string) (context.Context, relayDB, sqldb.DB, func(), error) {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	d, err := resolveDB(dbFlag, dialect, os.Getenv)
	if err != nil {
		return nil, relayDB{}, nil, nil, err
	}
	db, closeDB, err := openDB(ctx, d)
	if err != nil {
		return nil, relayDB{}, nil, nil, err
	}
	return ctx, d, db, closeDB, nil
}

// openDB opens the resolved database through its dialect package (pgx for
// PostgreSQL, database/sql for MySQL and SQLite). Nothing connects yet.
func openDB(ctx context.Context, d relayDB) (sqldb.DB, func(), error) {
	switch d.dialect {
	case "postgres":
		cfg, err := pgxpool.ParseConfig(d.dsn)
		if err != nil {
			return nil, nil, fmt.Errorf("--db %s: %w", d.redacted(), err)
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, nil, fmt.Errorf("--db %s: %w", d.redacted(), err)
		}
		return postgres.Pgx(pool), pool.Close, nil
	case "mysql":
		db, err := sql.Open("mysql", d.dsn)
		if err != nil {
			return nil, nil, fmt.Errorf("--db %s: %w", d.redacted(), err)
		}
		return mysql.Std(db), func() { _ = db.Close() }, nil
	default:
		db, err := sqlite.Open(d.dsn)
		if err != nil {
			return nil, nil, err
		}
		return sqlite.Std(db), func() { _ = db.Close() }, nil
	}
}

// openStore returns the outbox store on db, migrating unless noMigrate;
// on PostgreSQL it LISTENs for new rows. deleteSent: published rows are
// deleted instead of marked sent (outbox.StoreConfig.DeleteSent).
func openStore(ctx context.Context, d relayDB, db sqldb.DB, table string, noMigrate, deleteSent bool) (*outbox.SQLStore, error) {
	cfg := outbox.StoreConfig{Table: table, NoMigrate: noMigrate, DeleteSent: deleteSent}
	if d.dialect == "postgres" {
		cfg.Listen = postgres.Listener(d.dsn)
	}
	return outbox.NewStore(ctx, db, cfg)
}

// waitDB runs f (a migration, a store's setup) until it succeeds, as a
// service starts (idemq.WaitFor): a database that is down, starting,
// refusing connections or stalled is waited out, logged once when the
// wait begins, every minute it goes on and when it ends; only a definite
// configuration error (sqldb.ConfigError) still failing after the grace
// period ends it, naming --db.
func waitDB(ctx context.Context, log *slog.Logger, d relayDB, what string, f func(context.Context) error) error {
	return idemq.WaitFor(ctx, idemq.WaitConfig{Logger: log}, idemq.Dependency{
		Name: what + " (" + d.dialect + " " + d.redacted() + ")", Check: f, Config: sqldb.ConfigError,
		Fix: "--db: user, password, database, host",
	})
}
