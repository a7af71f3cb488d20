// Package inbox is the third layer of defence: the inbox row (group,
// message ID) is inserted in the same database transaction as the
// handler's effect, so the effect is applied exactly once even when a
// consumer dies between its commit and its ack.
//
// Per delivery: BEGIN → INSERT the row (ON CONFLICT DO NOTHING on
// PostgreSQL and SQLite; on MySQL a plain INSERT whose duplicate-key error,
// 1062, is the duplicate) → row already there: a duplicate, roll back,
// count, ack → else run the handler with the open transaction → COMMIT →
// ack. A handler error rolls back and goes to the failure policy; so does
// a row the database refuses for any other reason (never read as a
// duplicate). [Inbox.Batch] runs many deliveries
// in one transaction: their inbox rows in one INSERT (on PostgreSQL one
// statement whatever the batch size, the IDs as one array) and their
// handlers in turn, or, when a handler fails, again with a savepoint each.
// [Inbox.BatchFunc] does the same with a handler called once per batch
// with all its fresh deliveries, so their effects can be one statement.
//
// The inbox is a statement set over idemq's SQL layer (package sqldb) and
// imports no driver: hand it a database through a dialect package —
// inbox.New(ctx, postgres.Pgx(pool), cfg) gives the handler a pgx.Tx;
// postgres.Std, mysql.Std and sqlite.Std a *sql.Tx. Its table has
// versioned migrations ([Schema]), applied by [New] unless
// Config.NoMigrate. On MySQL the row is a plain INSERT into VARBINARY
// columns, whose duplicate-key error (1062) is the duplicate, never INSERT
// IGNORE; a table you manage yourself with narrower or non-binary columns
// needs a strict sql_mode.
//
// # Guarantees
//
//	combination              completed duplicate        killed after commit   store forgets
//	inbox alone              tx opened, row stops it    suppressed            n/a
//	dedup.Guard + inbox      turned away, no tx         suppressed (row)      row stops it
//	dedup.Guard alone        turned away                duplicate possible    duplicates
//
// With dedup.Guard (memory or Redis store) in front, a completed duplicate
// is acked without opening a transaction; the inbox row stays the
// authority whenever the store is wrong (lost record, restart without
// persistence, kill between commit and Complete). Rows older than
// Config.Window are purged ([Inbox.Purge], [Inbox.RunPurger]); a Window
// shorter than Config.RetryHorizon is rejected by [New].
package inbox
