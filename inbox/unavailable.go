package inbox

import (
	"context"
	"errors"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/sqldb"
)

// DependencyDatabase is the Dependency of the [idemq.UnavailableError]s the
// inbox returns.
const DependencyDatabase = "database"

// ConnectionError reports whether err says the database could not be
// reached or the connection to it was lost — not that a statement failed:
// [sqldb.ConnectionError] (network errors, driver.ErrBadConn, SQLSTATE
// class 08 and 57P01..57P03, 53300, the drivers' closed-connection errors).
// Constraint violations, syntax errors and every other answer from the
// server are not connection errors: they are the handler's failures.
// context.Canceled and context.DeadlineExceeded are not one either (the
// handler was cut short, or ran out of its time: a handler timeout is an
// attempt, not an outage), nor is anything that says the handler timed out.
func ConnectionError(err error) bool {
	return !errors.Is(err, idemq.ErrHandlerTimeout) && sqldb.ConnectionError(err)
}

// Classify returns err as an [idemq.UnavailableError] for the dependency
// "database" when it is a [ConnectionError], and err unchanged otherwise
// (nil, a permanent or reject error, an [idemq.UnavailableError] already,
// any SQL error). A handler that runs its own transactions (not through an
// inbox) can return Classify(err) so the failure policy does not count a
// database outage as a failed attempt.
func Classify(err error) error {
	if err == nil || idemq.IsUnavailable(err) || idemq.IsPermanent(err) || !ConnectionError(err) {
		return err
	}
	return idemq.Unavailable(DependencyDatabase, err)
}

// Probe checks that the inbox's database answers and writes: in a
// transaction it rolls back, it runs a DELETE on the inbox table that
// matches no row. A database that answers reads but refuses writes (a hot
// standby or read-only replica answering after a failover, MySQL with
// read_only, an SQLite file another writer holds) fails it, so its
// failures are an outage, not the message's. Register it with the
// consumer's breaker (idemq.ConsumerConfig.Breaker.Probes) so a paused
// consumer resumes as soon as the database is back. A failure is an
// [idemq.UnavailableError].
func (ib *Inbox[T]) Probe(ctx context.Context) error {
	tx, err := ib.db.Begin(ctx, sqldb.TxOptions{})
	if err != nil {
		return idemq.Unavailable(DependencyDatabase, err)
	}
	if _, err := tx.Exec(ctx, ib.st.probe.SQL); err != nil {
		_ = sqldb.Rollback(ctx, tx)
		return idemq.Unavailable(DependencyDatabase, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		return idemq.Unavailable(DependencyDatabase, err)
	}
	return nil
}
