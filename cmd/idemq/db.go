package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/dburl"
)

// acceptedForms is the help of a --db refusal.
const acceptedForms = "write postgres://… (or postgresql://…), mysql://… or a go-sql-driver DSN user:password@tcp(host:3306)/db, " +
	"sqlite://path or file:path; or name the database with --dialect postgres|mysql|sqlite " +
	"(a keyword/value DSN such as host=… user=… needs --dialect postgres, a plain SQLite path --dialect sqlite)"

// resolveDB picks the database from --db, --dialect and the env
// (dburl.Parse). The dialect is never guessed from a form that does not
// say it: a DSN it cannot place is an error, never a SQLite file named
// after it.
func resolveDB(db, dialect string, getenv func(string) string) (dburl.Target, error) {
	name, err := dburl.Dialect(dialect)
	if err != nil {
		return dburl.Target{}, fmt.Errorf("--dialect %q: want postgres, mysql or sqlite", strings.ToLower(dialect))
	}
	if db == "" {
		db = getenv(envOutboxDB)
	}
	if db == "" {
		switch name {
		case sqldb.MySQL:
			db = getenv(envMySQLURL)
		case sqldb.SQLite:
		default:
			db = getenv(envPostgreURL)
		}
	}
	if db == "" {
		return dburl.Target{}, errors.New("no database: set --db (or IDEMQ_OUTBOX_DB_URL / IDEMQ_POSTGRES_URL)")
	}
	t, err := dburl.Parse(db, name)
	var refused *dburl.Error
	switch {
	case err == nil:
		return t, nil
	case errors.Is(err, dburl.ErrForm):
		return dburl.Target{}, fmt.Errorf("--db %s: cannot tell which database this is: %s", redact.DSN(db), acceptedForms)
	case errors.Is(err, dburl.ErrNotSQLite):
		return dburl.Target{}, fmt.Errorf("--db %s with --dialect sqlite: not a SQLite path (sqlite://path, file:path or a file path)", redact.DSN(db))
	case errors.Is(err, dburl.ErrEmptyPath):
		return dburl.Target{}, errors.New("--db: empty SQLite path")
	case errors.As(err, &refused):
		return dburl.Target{}, fmt.Errorf("--db: %w", refused.Err)
	}
	return dburl.Target{}, err
}

// connect resolves --db and --dialect and opens the database: the
// command's context, the resolved database, the handle and its closer.
func connect(cmd *cobra.Command, dbFlag, dialect string) (context.Context, dburl.Target, sqldb.DB, func(), error) {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	d, err := resolveDB(dbFlag, dialect, os.Getenv)
	if err != nil {
		return nil, dburl.Target{}, nil, nil, err
	}
	db, closeDB, err := openDB(ctx, d)
	if err != nil {
		return nil, dburl.Target{}, nil, nil, err
	}
	return ctx, d, db, closeDB, nil
}

// openDB opens the resolved database (dburl.Open). Nothing connects yet.
func openDB(ctx context.Context, d dburl.Target) (sqldb.DB, func(), error) {
	db, closeDB, err := dburl.Open(ctx, d)
	var refused *dburl.Error
	if errors.As(err, &refused) {
		return nil, nil, fmt.Errorf("--db %s: %w", refused.DSN, refused.Err)
	}
	return db, closeDB, err
}

// openStore returns the outbox store on db, migrating unless noMigrate;
// on PostgreSQL it LISTENs for new rows. deleteSent: published rows are
// deleted instead of marked sent (outbox.StoreConfig.DeleteSent).
func openStore(ctx context.Context, d dburl.Target, db sqldb.DB, table string, noMigrate, deleteSent bool) (*outbox.SQLStore, error) {
	return outbox.NewStore(ctx, db, outbox.StoreConfig{Table: table, NoMigrate: noMigrate, DeleteSent: deleteSent, Listen: d.Listener()})
}

// waitDB runs f (a migration, a store's setup) until it succeeds, as a
// service starts (idemq.WaitFor): a database that is down, starting,
// refusing connections or stalled is waited out, logged once when the
// wait begins, every minute it goes on and when it ends; only a definite
// configuration error (sqldb.ConfigError) still failing after the grace
// period ends it, naming --db.
func waitDB(ctx context.Context, log *slog.Logger, d dburl.Target, what string, f func(context.Context) error) error {
	return idemq.WaitFor(ctx, idemq.WaitConfig{Logger: log}, idemq.Dependency{
		Name: what + " (" + d.Dialect + " " + d.Redacted() + ")", Check: f, Config: sqldb.ConfigError,
		Fix: "--db: user, password, database, host",
	})
}
