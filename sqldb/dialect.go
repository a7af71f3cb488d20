package sqldb

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The dialects' names ([Dialect.Name]).
const (
	Postgres = "postgres"
	MySQL    = "mysql" // MySQL and MariaDB
	SQLite   = "sqlite"
)

// Dialect is the SQL one database speaks. The dialect packages (sqldb/postgres,
// sqldb/mysql, sqldb/sqlite) fill it in; applications only pass it along.
type Dialect struct {
	// Name is [Postgres], [MySQL] or [SQLite]: for messages, and for the
	// DDL written per dialect (migrations, [Migration.Up]). Other
	// statements differ by the capabilities below, never by the name.
	Name string
	// Dollar: bind parameters are $1, $2, … (PostgreSQL); otherwise ?.
	Dollar bool
	// QuoteChar quotes identifiers: " or `.
	QuoteChar string
	// Schemas: a table name may be schema-qualified ("schema.name").
	Schemas bool
	// NowMillis is an SQL expression for the database's current time in
	// Unix milliseconds (a BIGINT), constant within one statement.
	NowMillis string
	// Now is an SQL expression for the database's current timestamp (the
	// type of the outbox's time columns).
	Now string
	// NowPlusMillis returns an expression for [Dialect.Now] plus the
	// expression ms milliseconds (ms may be negative).
	NowPlusMillis func(ms string) string
	// AgeSeconds returns an expression for the age in seconds (a float) of
	// the timestamp expression col.
	AgeSeconds func(col string) string
	// Time converts a client time to the value bound for a timestamp
	// column the component writes itself (the inbox's received_at).
	Time func(t time.Time) any
	// Lock takes the database-wide advisory lock name for the rest of tx
	// (migrations serialise on it) and returns what releases it before
	// the transaction ends (nil when the transaction's end releases it).
	// Nil: the dialect has none, and the transaction's first write (which
	// takes the database's write lock, as in SQLite) serialises.
	Lock func(ctx context.Context, tx Querier, name string) (unlock func(context.Context), err error)
	// DuplicateKey reports a unique-key violation.
	DuplicateKey func(err error) bool
	// Retryable reports a transient error (deadlock, serialization
	// failure, a busy database) after which the statement or transaction,
	// having had no effect, may run again.
	Retryable func(err error) bool
	// Exists reports a DDL error saying the object is already there (MySQL
	// has no CREATE INDEX IF NOT EXISTS); migrations ignore it. Nil: none.
	Exists func(err error) bool
	// ConnLost reports the driver's own connection-loss errors, on top of
	// what [ConnectionError] knows. Nil: none.
	ConnLost func(err error) bool

	// Upsert is the form of an INSERT that updates the row whose key it
	// collides with.
	Upsert Upsert
	// Returning: INSERT, UPDATE and DELETE take a RETURNING clause.
	Returning bool
	// WritableCTE: a WITH clause may hold an INSERT … RETURNING whose rows
	// the rest of the statement reads (PostgreSQL).
	WritableCTE bool
	// Arrays: a Go slice binds as an SQL array, and the dialect has
	// = ANY(array), ARRAY(subquery), unnest(array) and expr::type casts
	// (PostgreSQL). Without it a list is one parameter per element
	// ([Repeat]).
	Arrays bool
	// SkipLocked is the locking clause of a SELECT that locks the rows it
	// reads and skips those other transactions hold ("FOR UPDATE SKIP
	// LOCKED"). Empty: none (SQLite, one writer at a time). Templates
	// write it {skip_locked} ([Dialect.Compile]).
	SkipLocked string
	// GapLocks: in the default isolation level a locking read also locks
	// the gaps between index records (InnoDB's REPEATABLE READ), so a
	// transaction that claims rows with [Dialect.SkipLocked] asks for
	// [TxOptions.ReadCommitted] to not deadlock with concurrent inserts.
	GapLocks bool
	// DeleteLimit: DELETE takes ORDER BY and LIMIT (MySQL). Otherwise
	// [Dialect.LimitedDelete] picks the rows in a subquery.
	DeleteLimit bool
	// RowID is the implicit row id column of a table that has one
	// (SQLite: rowid). Empty: none.
	RowID string
	// JSONIn returns the expression storing the text expression expr in a
	// JSON column (PostgreSQL: expr::jsonb), JSONOut the text of the JSON
	// column col (col::text). Nil: JSON columns hold text, as it is.
	JSONIn, JSONOut func(expr string) string
	// Notify returns a statement that wakes the listeners of the channel
	// (an expression, typically a parameter) when its transaction commits
	// (PostgreSQL: SELECT pg_notify(channel, '')). Nil: none; listeners
	// poll.
	Notify func(channel string) string
	// AsyncCommit is an expression that makes the transaction it runs in
	// commit without waiting for its WAL flush (PostgreSQL:
	// set_config('synchronous_commit', 'off', true)). Empty: none.
	AsyncCommit string
	// NoBitmapScan is an expression that keeps the planner from bitmap
	// scans for the rest of the transaction, so a LIMIT walks an index in
	// order (PostgreSQL: set_config('enable_bitmapscan', 'off', true)).
	// Empty: none.
	NoBitmapScan string
}

// Upsert is a form of INSERT that updates the row it collides with
// ([Dialect.Upsert]).
type Upsert int

const (
	// OnConflict: INSERT … ON CONFLICT (key) DO UPDATE SET … WHERE …, the
	// row proposed for insertion named EXCLUDED, and INSERT … ON CONFLICT
	// DO NOTHING (PostgreSQL, SQLite).
	OnConflict Upsert = iota + 1
	// OnDuplicateKey: INSERT … ON DUPLICATE KEY UPDATE col = …, the
	// assignments made left to right, each seeing the ones before (MySQL,
	// MariaDB). It has no DO NOTHING: a plain INSERT fails with
	// [Dialect.DuplicateKey] instead (INSERT IGNORE would also turn other
	// errors into warnings).
	OnDuplicateKey
)

// IsDuplicateKey reports whether err is a unique-key violation.
func (d *Dialect) IsDuplicateKey(err error) bool {
	return err != nil && d.DuplicateKey != nil && d.DuplicateKey(err)
}

// IsRetryable reports whether err is transient (see [Dialect.Retryable]).
func (d *Dialect) IsRetryable(err error) bool {
	return err != nil && d.Retryable != nil && d.Retryable(err)
}

// IsConnectionError reports whether err says the database could not be
// reached or the connection was lost: [ConnectionError] or the dialect's
// own [Dialect.ConnLost].
func (d *Dialect) IsConnectionError(err error) bool {
	return ConnectionError(err) || (err != nil && d.ConnLost != nil && d.ConnLost(err))
}

// ErrInvalidIdentifier is returned for a table or column name that breaks
// the identifier rule ([CheckTable]).
var ErrInvalidIdentifier = errors.New("sqldb: invalid SQL identifier")

// MaxTableLength bounds a table name (without its schema) in bytes, so the
// index names derived from it stay within 63 bytes (PostgreSQL's limit).
const MaxTableLength = 48

var (
	tableRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,47}$`)
	identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)
)

// CheckTable validates a table name: "name" or, where the dialect has
// schemas, "schema.name"; each part [A-Za-z_][A-Za-z0-9_]*, the schema at
// most 63 bytes, the name at most [MaxTableLength].
func (d *Dialect) CheckTable(name string) error {
	schema, base, qualified := strings.Cut(name, ".")
	if !qualified {
		schema, base = "", name
	}
	switch {
	case qualified && !d.Schemas:
		return fmt.Errorf("%w: %q: %s table names are not schema-qualified", ErrInvalidIdentifier, name, d.Name)
	case qualified && !identRE.MatchString(schema), !tableRE.MatchString(base):
		return fmt.Errorf("%w: %q (want [schema.]name, each [A-Za-z_][A-Za-z0-9_]*, the name at most %d bytes)", ErrInvalidIdentifier, name, MaxTableLength)
	}
	return nil
}

// CheckColumn validates a column name: [A-Za-z_][A-Za-z0-9_]*, at most
// 63 bytes.
func CheckColumn(name string) error {
	if !identRE.MatchString(name) {
		return fmt.Errorf("%w: column %q", ErrInvalidIdentifier, name)
	}
	return nil
}

// Quote quotes an identifier that has passed [CheckTable] or
// [CheckColumn] (or is derived from one): each dot-separated part.
func (d *Dialect) Quote(ident string) string {
	parts := strings.Split(ident, ".")
	for i, p := range parts {
		parts[i] = d.QuoteChar + p + d.QuoteChar
	}
	return strings.Join(parts, ".")
}

// QuoteTable validates table with [CheckTable] and quotes it.
func (d *Dialect) QuoteTable(table string) (string, error) {
	if err := d.CheckTable(table); err != nil {
		return "", err
	}
	return d.Quote(table), nil
}

// Derived returns the quoted name of an object derived from table (an
// index): the table's name without its schema, then suffix.
func (d *Dialect) Derived(table, suffix string) string {
	return d.Quote(table[strings.LastIndex(table, ".")+1:] + suffix)
}

// Placeholder returns the n-th (1-based) bind parameter.
func (d *Dialect) Placeholder(n int) string {
	if d.Dollar {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// LockKey derives a 63-bit advisory-lock key from name (PostgreSQL's
// pg_advisory_xact_lock takes a bigint).
func LockKey(name string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return int64(h.Sum64() >> 1)
}

// Retry runs fn again, at most n more times, after an error the dialect
// calls retryable, waiting 1, 2, 4 … ms (at most 200 ms) in between.
func (d *Dialect) Retry(ctx context.Context, n int, fn func() error) error {
	for attempt := 0; ; attempt++ {
		err := fn()
		if err == nil || !d.IsRetryable(err) || attempt == n {
			return err
		}
		t := time.NewTimer(min(time.Duration(1<<min(attempt, 10))*time.Millisecond, 200*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}
