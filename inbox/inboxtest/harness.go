// Package inboxtest is the conformance suite every SQL dialect of the inbox
// runs: the same tests on PostgreSQL (pgx and database/sql), MySQL/MariaDB
// and SQLite, against the real database and, for the end-to-end ones, the
// real RabbitMQ through idemq.Consumer. A dialect is done when it passes
// [Run] and serves [HelperProcess].
//
// Each test applies a deliberately non-idempotent effect,
// UPDATE accounts SET balance = balance + amount, and checks that it was
// applied exactly once per message ID whatever the broker or the publisher
// duplicated.
package inboxtest

import (
	"context"
	"database/sql"
	"os"
	"testing"

	"github.com/idemq/idemq/inbox"
)

// DB is one open database as the suite uses it.
type DB[T any] struct {
	// Driver is the inbox driver under test.
	Driver inbox.Driver[T]
	// Exec runs a statement outside any inbox transaction (setup).
	Exec func(ctx context.Context, query string, args ...any) error
	// QueryInt runs a query returning one integer (assertions).
	QueryInt func(ctx context.Context, query string, args ...any) (int64, error)
	// LockWaiters, optional, returns how many sessions of this database
	// are waiting on a row lock (to prove a concurrent duplicate blocks).
	LockWaiters func(ctx context.Context) (int, error)
}

// Harness adapts a dialect to the suite.
type Harness[T any] struct {
	// Name labels the dialect in messages.
	Name string
	// NewDSN returns the DSN of a fresh, empty database for t.
	NewDSN func(t testing.TB) string
	// Open opens dsn; the DB is closed at t's cleanup.
	Open func(t testing.TB, dsn string) DB[T]
}

// StdDB builds a [DB] for a database/sql dialect. lockWaiters, when not
// empty, is a query counting this database's sessions waiting on a lock.
func StdDB(drv inbox.Driver[*sql.Tx], db *sql.DB, lockWaiters string) DB[*sql.Tx] {
	qi := func(ctx context.Context, q string, args ...any) (int64, error) {
		var n int64
		err := db.QueryRowContext(ctx, q, args...).Scan(&n)
		return n, err
	}
	out := DB[*sql.Tx]{
		Driver: drv,
		Exec: func(ctx context.Context, q string, args ...any) error {
			_, err := db.ExecContext(ctx, q, args...)
			return err
		},
		QueryInt: qi,
	}
	if lockWaiters != "" {
		out.LockWaiters = func(ctx context.Context) (int, error) {
			n, err := qi(ctx, lockWaiters)
			return int(n), err
		}
	}
	return out
}

// Flavor is, in the helper process of the kill test, the Name of the
// harness that started it (a test binary with several harnesses picks the
// right one with it).
func Flavor() string { return os.Getenv(envFlavor) }
