// Package sqltest holds the [sqldbtest.Backend]s idemq's own tests run
// every SQL conformance suite on: PostgreSQL through pgx and through
// database/sql, MariaDB and SQLite, on the shared test servers (one fresh
// database per test).
package sqltest

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/mysql"
	"github.com/idemq/idemq/sqldb/postgres"
	"github.com/idemq/idemq/sqldb/sqldbtest"
	"github.com/idemq/idemq/sqldb/sqlite"
)

const pgLockWaiters = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"

// PostgresPgx is PostgreSQL through a *pgxpool.Pool.
func PostgresPgx() sqldbtest.Backend[pgx.Tx] {
	return sqldbtest.Backend[pgx.Tx]{
		Name:        "postgres-pgx",
		NewDatabase: func(t testing.TB) string { return testenv.PostgresDB(t) },
		Open: func(t testing.TB, url string) (sqldb.Native[pgx.Tx], func()) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			pool, err := pgxpool.New(ctx, url)
			if err != nil {
				t.Fatalf("pgxpool: %v", err)
			}
			var once sync.Once
			closeFn := func() { once.Do(pool.Close) }
			t.Cleanup(closeFn)
			return postgres.Pgx(pool), closeFn
		},
		Tx:          func(tx pgx.Tx) sqldb.Querier { return postgres.PgxTx(tx) },
		LockWaiters: pgLockWaiters,
	}
}

// PostgresStd is PostgreSQL through database/sql and pgx/v5/stdlib.
func PostgresStd() sqldbtest.Backend[*sql.Tx] {
	return stdBackend("postgres-stdlib", testenv.PostgresDB, "pgx", func(s string) string { return s }, postgres.Std, pgLockWaiters)
}

// MySQL is MariaDB through go-sql-driver/mysql.
//
// No LockWaiters: querying information_schema.innodb_trx while a
// transaction waits on a row lock proved unreliable (it stalled until the
// lock wait ended).
func MySQL() sqldbtest.Backend[*sql.Tx] {
	return stdBackend("mysql", testenv.MySQLDB, "mysql", func(s string) string { return s }, mysql.Std, "")
}

// SQLite is SQLite through modernc.org/sqlite, opened with sqlite.DSN.
func SQLite() sqldbtest.Backend[*sql.Tx] {
	return stdBackend("sqlite", testenv.SQLitePath, "sqlite", func(p string) string { return sqlite.DSN(p, 0) }, sqlite.Std, "")
}

func stdBackend(name string, newDB func(testing.TB) string, driver string, dsn func(string) string,
	adapt func(*sql.DB) sqldb.Native[*sql.Tx], lockWaiters string) sqldbtest.Backend[*sql.Tx] {
	return sqldbtest.Backend[*sql.Tx]{
		Name:        name,
		NewDatabase: newDB,
		Open: func(t testing.TB, addr string) (sqldb.Native[*sql.Tx], func()) {
			db, err := sql.Open(driver, dsn(addr))
			if err != nil {
				t.Fatalf("sql.Open %s: %v", driver, err)
			}
			var once sync.Once
			closeFn := func() { once.Do(func() { _ = db.Close() }) }
			t.Cleanup(closeFn)
			return adapt(db), closeFn
		},
		Tx:          func(tx *sql.Tx) sqldb.Querier { return sqldb.StdTx(tx) },
		LockWaiters: lockWaiters,
	}
}
