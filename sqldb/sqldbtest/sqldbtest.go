// Package sqldbtest is what idemq's SQL conformance suites (dedup
// sqlstoretest, inboxtest, outboxtest, businesstest) take to reach a
// database: a [Backend]. The suites are self-contained — they need the
// database and nothing else (no broker) — and describe what a dialect can
// do with each suite's Features struct, as Watermill's pub/sub suite does.
//
//	func TestInboxPostgres(t *testing.T) {
//		inboxtest.Run(t, myPostgresBackend(), inboxtest.Features{Returning: true, Parallel: true})
//	}
package sqldbtest

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/sqldb"
)

// Backend is one way to reach one kind of database: a dialect and a
// driver (pgx, database/sql). T is the driver's transaction type, which
// the inbox hands to its handler.
type Backend[T any] struct {
	// Name labels the backend in messages ("postgres-pgx", "mysql", …).
	Name string
	// NewDatabase returns the address of a fresh, empty database no other
	// test sees (dropped at t's cleanup). Required.
	NewDatabase func(t testing.TB) string
	// Open opens a new pool on the database at addr, as another process
	// would, closed at t's cleanup; close closes it earlier (safe to call
	// twice). Required.
	Open func(t testing.TB, addr string) (db sqldb.Native[T], close func())
	// Tx hands a transaction of T to idemq: postgres.PgxTx for a pgx.Tx,
	// sqldb.StdTx for a *sql.Tx. Required.
	Tx func(tx T) sqldb.Querier
	// LockWaiters, optional, is a query counting this database's sessions
	// waiting on a row lock (to prove that a concurrent duplicate blocks).
	LockWaiters string
}

// Fresh opens a pool on a fresh database.
func (b Backend[T]) Fresh(t testing.TB) sqldb.Native[T] {
	t.Helper()
	db, _ := b.Open(t, b.NewDatabase(t))
	return db
}

// Context returns a context for one test step with a generous deadline
// (the machines are small and shared), cancelled at t's cleanup.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Int runs a query returning one integer on db, failing t on an error.
func Int(t testing.TB, db sqldb.Querier, query string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(Context(t), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// Exec runs statements on db, failing t on an error.
func Exec(t testing.TB, db sqldb.Querier, query string, args ...any) {
	t.Helper()
	if _, err := db.Exec(Context(t), query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}
