// Package sqlite is the SQLite dialect of the SQL dedup store
// ([sqlstore.Store]), through modernc.org/sqlite (pure Go, no cgo). It
// compiles no PostgreSQL or MySQL driver.
//
// Schema (table name configurable, default idemq_dedup):
//
//	CREATE TABLE idemq_dedup (
//		"key"      TEXT PRIMARY KEY,   -- BINARY collation: byte for byte
//		state      TEXT NOT NULL CHECK (state IN ('processing', 'done')),
//		owner      TEXT NOT NULL DEFAULT '',
//		expires_at INTEGER NOT NULL    -- Unix milliseconds
//	) WITHOUT ROWID;
//	CREATE INDEX idemq_dedup_expires_idx ON idemq_dedup (expires_at);
//
// The clock is julianday('now') in milliseconds — SQLite is embedded, so
// that is the clock of the host running the process (every process sharing
// the file is on that host). A claim is one INSERT … ON CONFLICT DO UPDATE …
// WHERE … RETURNING; when it returns nothing (the row was not taken), one
// SELECT reads the row.
//
// # Concurrency
//
// SQLite has one writer at a time. A connection that finds the database
// locked fails with SQLITE_BUSY at once unless it has a busy timeout, so
// open the database with [Open] (or a DSN from [DSN]), which sets
// busy_timeout(5000) — writers wait up to 5 s for the lock, across
// connections and processes — and journal_mode(WAL), so readers never block
// the writer. [Open] also limits the *sql.DB to one connection: the
// process's goroutines then queue in database/sql instead of polling the
// file lock, which is faster under contention; other processes still wait
// through the busy timeout. Both settings are tested with 50 goroutines
// claiming one key.
package sqlite
