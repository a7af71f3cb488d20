// Package sqldb is idemq's one SQL layer: the [Dialect] (placeholders,
// identifier quoting and the one identifier rule, the database clock,
// migration locks, duplicate-key, retryable and connection-error
// detection), the executor interfaces ([Querier], [Tx], [DB], [Native])
// with their database/sql adapter, and versioned migrations ([Up],
// [Status]). The dedup SQL store, the inbox, the outbox and the business
// helpers are statement sets over it.
//
// It imports no driver. A database is handed to idemq through its dialect
// package, which brings only its own driver:
//
//	sqldb/postgres  PostgreSQL: postgres.Pgx(pool or conn) through pgx v5, postgres.Std(*sql.DB) through pgx/v5/stdlib
//	sqldb/mysql     MySQL and MariaDB (InnoDB): mysql.Std(*sql.DB) through go-sql-driver/mysql
//	sqldb/sqlite    SQLite: sqlite.Std(*sql.DB) through modernc.org/sqlite (no cgo)
//
// A tool that takes any database as one URL or DSN (the idemq command)
// resolves and opens it with sqldb/dburl, which brings all three.
//
// # Handing idemq a transaction
//
// Where idemq runs statements inside your transaction (outbox Store.Add,
// the business helpers), it takes a [Querier], and there is one way to
// make one from your transaction:
//
//	sqldb.StdTx(tx)      // a database/sql *sql.Tx (any driver)
//	postgres.PgxTx(tx)   // a pgx.Tx
//
// Where idemq opens transactions of its own (the dedup store, the inbox,
// the outbox relay), it takes a [DB] from the dialect package:
// postgres.Pgx(pool), postgres.Std(db), mysql.Std(db), sqlite.Std(db). An
// inbox handler receives the driver's own transaction (pgx.Tx or *sql.Tx):
// wrap it as above to pass it on.
//
// # Statements
//
// Every statement idemq runs is a template compiled once per dialect by
// [Dialect.Compile]: {table} and the other variables are quoted names or
// the dialect's expressions ({now}, {ts}, {skip_locked}), @name a bind
// parameter (? or $n). Where the dialects differ, the template is built
// from the [Dialect]'s capabilities — its upsert form, RETURNING, arrays,
// its locking clause, its clock expressions, [Dialect.LimitedDelete] for
// a DELETE of at most n rows, [Repeat] and [List] for a list of
// parameters — never from its name; only the DDL of migrations is written
// per dialect name.
//
// # Identifiers
//
// Every table name idemq takes follows one rule ([CheckTable]): "name" or
// "schema.name" (not on SQLite), each part [A-Za-z_][A-Za-z0-9_]*, the
// name at most 48 bytes so the index names derived from it stay within
// PostgreSQL's 63. Names are always quoted, so they are case-sensitive on
// PostgreSQL: prefer lower case.
//
// # Migrations
//
// Every table idemq owns has numbered up-migrations per dialect. [Up]
// applies the pending ones in order under one lock per database
// (PostgreSQL pg_advisory_xact_lock, MySQL GET_LOCK, SQLite the write
// lock) and records each in the table idemq_migrations, so concurrent
// starts serialise and a later release upgrades an existing database.
// The components run [Up] on start unless their Config.NoMigrate is set;
// `idemq migrate up|status` does the same from the command line.
package sqldb
