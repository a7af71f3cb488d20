// Package business holds the idempotency helpers for the business layer —
// the third layer of defence, inside the effect itself:
//
//   - [InsertOnce]: run an INSERT ... ON CONFLICT DO NOTHING (PostgreSQL,
//     SQLite) or INSERT IGNORE (MySQL); "already there" is a success,
//     reported as inserted=false, never an error.
//   - duplicate-key detection for code that inserts without ON CONFLICT:
//     business/postgres.IsDuplicateKey (pgconn.PgError 23505),
//     business/mysql.IsDuplicateKey (error 1062), business/sqlite.IsDuplicateKey
//     (SQLITE_CONSTRAINT_UNIQUE / PRIMARYKEY). Each lives in its own
//     package so a pgx user never compiles the MySQL or SQLite driver.
//   - [Machine.Transition]: move a row from an expected state to the next;
//     a row already in the target state is an idempotent success, any other
//     state a [*TransitionError] naming both, a missing row [ErrNotFound].
//
// The helpers run on any [Execer]: [SQL] adapts *sql.DB, *sql.Tx and
// *sql.Conn; business/postgres.Pgx adapts pgx.Tx, *pgx.Conn and
// *pgxpool.Pool. Inside an inbox handler pass the inbox's transaction.
package business
