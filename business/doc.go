// Package business holds the idempotency helpers for the business layer —
// the third layer of defence, inside the effect itself:
//
//   - [InsertOnce]: run an INSERT ... ON CONFLICT DO NOTHING (PostgreSQL,
//     SQLite) or INSERT IGNORE (MySQL); "already there" is a success,
//     reported as inserted=false, never an error.
//   - duplicate-key detection for code that inserts without ON CONFLICT
//     lives with each dialect: postgres.IsDuplicateKey (pgconn.PgError
//     23505), mysql.IsDuplicateKey (error 1062), sqlite.IsDuplicateKey
//     (SQLITE_CONSTRAINT_UNIQUE / PRIMARYKEY), in sqldb/postgres,
//     sqldb/mysql and sqldb/sqlite, so a pgx user never compiles the MySQL
//     or SQLite driver.
//   - [Machine.Transition]: move a row from an expected state to the next;
//     a row already in the target state is an idempotent success, any other
//     state a [*TransitionError] naming both, a missing row [ErrNotFound].
//
// The helpers run on a sqldb.Querier: your transaction handed over the one
// way, sqldb.StdTx(tx) for a *sql.Tx, postgres.PgxTx(tx) for a pgx.Tx.
// Inside an inbox handler pass the inbox's transaction so wrapped.
package business
