// Package inboxtest is the conformance suite every SQL backend of the
// inbox runs: the same tests on PostgreSQL (pgx and database/sql),
// MySQL/MariaDB and SQLite, against the real database. [Run] needs the
// database only; [RunBroker] adds the end-to-end cases through the real
// RabbitMQ and idemq.Consumer (IDEMQ_AMQP_URL). A backend is done when it
// passes both and serves [HelperProcess].
//
// Each test applies a deliberately non-idempotent effect,
// UPDATE accounts SET balance = balance + amount, and checks that it was
// applied exactly once per message ID whatever the broker or the publisher
// duplicated.
package inboxtest

import (
	"context"
	"os"
	"testing"

	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/sqldbtest"
)

// Features describes the backend under test.
type Features struct {
	// Parallel: the cases run in parallel (t.Parallel), each on its own
	// database.
	Parallel bool
}

// dbh is one open database as the suite uses it.
type dbh[T any] struct {
	// DB is the database under test.
	DB sqldb.Native[T]
	// Tx hands the handler's transaction to a statement.
	Tx func(T) sqldb.Querier
	// LockWaiters, when set, counts this database's sessions waiting on a
	// row lock.
	LockWaiters func(ctx context.Context) (int, error)
}

func open[T any](t testing.TB, b sqldbtest.Backend[T], addr string) dbh[T] {
	db, _ := b.Open(t, addr)
	out := dbh[T]{DB: db, Tx: b.Tx}
	if b.LockWaiters != "" {
		out.LockWaiters = func(ctx context.Context) (int, error) {
			n, err := out.QueryInt(ctx, b.LockWaiters)
			return int(n), err
		}
	}
	return out
}

// Exec runs a statement outside any inbox transaction (setup).
func (d dbh[T]) Exec(ctx context.Context, q string, args ...any) error {
	_, err := d.DB.Exec(ctx, q, args...)
	return err
}

// QueryInt runs a query returning one integer (assertions).
func (d dbh[T]) QueryInt(ctx context.Context, q string, args ...any) (int64, error) {
	var n int64
	err := d.DB.QueryRow(ctx, q, args...).Scan(&n)
	return n, err
}

// Flavor is, in the helper process of the kill test, the Name of the
// backend that started it (a test binary with several backends picks the
// right one with it).
func Flavor() string { return os.Getenv(envFlavor) }
