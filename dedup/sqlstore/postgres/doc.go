// Package postgres is the PostgreSQL dialect of the SQL dedup store
// ([sqlstore.Store]), through pgx v5: [New] takes a *pgxpool.Pool and runs
// natively on it; [NewDB] takes a *sql.DB (opened with pgx/v5/stdlib's "pgx"
// driver, or any driver that speaks $n placeholders). It compiles no MySQL or
// SQLite driver.
//
// Schema (table name configurable, default idemq_dedup):
//
//	CREATE TABLE idemq_dedup (
//		key        text COLLATE "C" PRIMARY KEY,
//		state      text NOT NULL CHECK (state IN ('processing', 'done')),
//		owner      text NOT NULL DEFAULT '',
//		expires_at bigint NOT NULL   -- Unix milliseconds, database clock
//	);
//	CREATE INDEX idemq_dedup_expires_idx ON idemq_dedup (expires_at);
//
// The clock is statement_timestamp() in milliseconds. A claim is one
// statement: INSERT … ON CONFLICT (key) DO UPDATE … WHERE the row is expired
// or ours, in a CTE that also returns the row it did not take. Migrations
// run in one DO block under pg_advisory_xact_lock, so concurrent migrations
// (which CREATE TABLE IF NOT EXISTS alone does not make safe in PostgreSQL)
// serialise. Purge deletes in batches with FOR UPDATE SKIP LOCKED: it skips
// rows a concurrent claim holds instead of waiting for them, and re-checks
// the expiry of every row it deletes.
//
// To read an expiry as a timestamp: to_timestamp(expires_at / 1000.0).
package postgres
