// Package sqlstore is the SQL dedup store: one [dedup.Store] (and
// [dedup.Inspector]) over a table with a primary key on the record key, a
// statement set over idemq's SQL layer (package sqldb). It imports no SQL
// driver; hand it a database through a dialect package, which brings only
// its own driver:
//
//	store, err := sqlstore.New(ctx, postgres.Pgx(pool), sqlstore.Config{}) // sqldb/postgres
//	store, err := sqlstore.New(ctx, mysql.Std(db), sqlstore.Config{})      // sqldb/mysql
//	store, err := sqlstore.New(ctx, sqlite.Std(db), sqlstore.Config{})     // sqldb/sqlite
//
// # Table
//
// One row per remembered key (default table "idemq_dedup"):
//
//	key        the opaque guard key "<prefix>:<group>:<id>", primary key,
//	           compared byte for byte (PostgreSQL text COLLATE "C",
//	           MySQL VARBINARY(1024), SQLite TEXT with BINARY collation)
//	state      'processing' or 'done'
//	owner      the lease holder's token ('' for done)
//	expires_at end of the lease (processing) or of the dedup window (done),
//	           Unix milliseconds (BIGINT), indexed for the purge
//
// The table has versioned migrations ([Schema]): [New] applies the
// pending ones unless [Config.NoMigrate] (`idemq migrate up` does it from
// the command line); several processes may start at once.
//
// # Clock
//
// Every expiry is computed and compared with the database's clock, in
// milliseconds, inside the statement that uses it — never the client's — so
// processes on hosts with skewed clocks agree on who holds a lease:
// PostgreSQL statement_timestamp(), MySQL UTC_TIMESTAMP(6) (time-zone and
// DST independent), SQLite julianday('now') (for SQLite, an embedded
// database, that is the clock of the host running the process). A row whose
// expires_at is not after now is treated as absent everywhere, whether or not
// the purger has deleted it yet.
//
// # Atomicity
//
// Every transition is a single statement, so it is atomic without an
// explicit transaction and never holds locks across round trips:
//
//   - Claim: one upsert that takes the row only when it is absent, expired or
//     already ours (PostgreSQL INSERT … ON CONFLICT DO UPDATE … WHERE, in a CTE
//     that also returns the row it lost to; SQLite the same with RETURNING;
//     MySQL INSERT … ON DUPLICATE KEY UPDATE with conditional assignments),
//     then — only when the answer is not already known — one read of the row.
//     The read happens after the upsert, so a row owned by our token is one we
//     took; an absent or expired row there means it changed in between, and
//     the claim starts over.
//   - Complete: an UPDATE of processing(token) with a live lease; when that
//     matches nothing, an upsert that records done unless a live record
//     (another token's lease, or done) is there, and ErrLeaseLost.
//   - Release: a DELETE of processing(token) with a live lease.
//   - Extend: an UPDATE of processing(token) with a live lease.
//
// # Purge
//
// Expired rows are harmless (treated as absent) but take space. [Store.Purge]
// deletes them in batches of a bounded size (short statements, short locks;
// PostgreSQL skips rows a concurrent claim holds with FOR UPDATE SKIP
// LOCKED); [Config.PurgeInterval] runs it in the background.
package sqlstore
