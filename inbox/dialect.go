package inbox

import (
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Dialect is the SQL flavour of a database: placeholders, quoting, the
// insert-if-absent statement, DDL and purge. The three values are plain data
// — using one imports no driver.
type Dialect struct {
	name string
}

// The supported dialects.
var (
	Postgres = Dialect{"postgres"}
	MySQL    = Dialect{"mysql"} // MySQL and MariaDB (InnoDB)
	SQLite   = Dialect{"sqlite"}
)

// String returns the dialect's name.
func (d Dialect) String() string { return d.name }

func (d Dialect) valid() bool { return d == Postgres || d == MySQL || d == SQLite }

// Placeholder returns the n-th (1-based) bind parameter: $n on PostgreSQL,
// ? elsewhere.
func (d Dialect) Placeholder(n int) string {
	if d == Postgres {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// ErrInvalidIdentifier is returned for a table name that is not a plain SQL
// identifier (letters, digits, underscore; optionally schema-qualified).
var ErrInvalidIdentifier = errors.New("inbox: invalid SQL identifier")

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// QuoteTable validates name ("table" or "schema.table") and quotes each
// part for the dialect.
func (d Dialect) QuoteTable(name string) (string, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("%w: %q", ErrInvalidIdentifier, name)
	}
	q := make([]string, len(parts))
	for i, p := range parts {
		if !identRE.MatchString(p) {
			return "", fmt.Errorf("%w: %q", ErrInvalidIdentifier, name)
		}
		if d == MySQL {
			q[i] = "`" + p + "`"
		} else {
			q[i] = `"` + p + `"`
		}
	}
	return strings.Join(q, "."), nil
}

// timeArg is how received_at is bound: a UTC time.Time on PostgreSQL and
// MySQL, Unix milliseconds on SQLite (an INTEGER column compares correctly
// whatever the driver's time format).
func (d Dialect) timeArg(t time.Time) any {
	if d == SQLite {
		return t.UnixMilli()
	}
	return t.UTC()
}

// statements is the SQL an Inbox runs, built once per table.
type statements struct {
	migrate  []string
	insert   string
	purge    string
	lockArgs []any // for migrate[0] on PostgreSQL

	// The batch inbox's multi-row insert: insertHead, then one
	// "(group, id, received_at)" tuple of placeholders per row, then
	// insertTail. returning, when not empty, is appended to make the
	// statement return the message_id of each row it inserted (PostgreSQL
	// and SQLite; MySQL has no INSERT ... RETURNING).
	insertHead, insertTail, returning string

	// dupIsError: insert and the multi-row insert fail on an existing row
	// (MySQL) instead of skipping it; the driver's [DuplicateKeyReporter]
	// tells that failure from any other.
	dupIsError bool
}

func (d Dialect) statements(table string) (statements, error) {
	qt, err := d.QuoteTable(table)
	if err != nil {
		return statements{}, err
	}
	base := table[strings.LastIndex(table, ".")+1:]
	idx, _ := d.QuoteTable(base + "_received_idx")
	if d == MySQL {
		idx = "`" + base + "_received_idx`"
	}
	var s statements
	switch d {
	case Postgres:
		h := fnv.New64a()
		_, _ = h.Write([]byte("idemq-inbox:" + table))
		s.migrate = []string{
			// Concurrent CREATE TABLE IF NOT EXISTS can still collide on
			// the catalog in PostgreSQL: serialize migrations on a lock.
			"SELECT pg_advisory_xact_lock($1)",
			"CREATE TABLE IF NOT EXISTS " + qt + ` (
	group_name  text        NOT NULL,
	message_id  text        NOT NULL,
	received_at timestamptz NOT NULL,
	PRIMARY KEY (group_name, message_id))`,
			"CREATE INDEX IF NOT EXISTS " + idx + " ON " + qt + " (received_at)",
		}
		s.lockArgs = []any{int64(h.Sum64() >> 1)}
		s.insert = "INSERT INTO " + qt + " (group_name, message_id, received_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING"
		s.insertHead = "INSERT INTO " + qt + " (group_name, message_id, received_at) VALUES "
		s.insertTail = " ON CONFLICT DO NOTHING"
		s.returning = " RETURNING message_id"
		s.purge = "DELETE FROM " + qt + " WHERE (group_name, message_id) IN (SELECT group_name, message_id FROM " + qt + " WHERE received_at < $1 LIMIT $2)"
	case MySQL:
		// VARBINARY: IDs compare byte for byte (no case folding, no
		// trailing-space padding as the default collations do).
		s.migrate = []string{
			"CREATE TABLE IF NOT EXISTS " + qt + ` (
	group_name  VARBINARY(255) NOT NULL,
	message_id  VARBINARY(255) NOT NULL,
	received_at DATETIME(6)    NOT NULL,
	PRIMARY KEY (group_name, message_id),
	KEY ` + idx + ` (received_at)) ENGINE=InnoDB`,
		}
		// A plain INSERT: the driver reports a duplicate key as error 1062
		// ([DuplicateKeyReporter]), which in MySQL rolls back only the
		// statement. Not INSERT IGNORE, which turns every error (a value
		// truncated or converted, a CHECK failure, ...) into a warning and
		// stores a mangled key or none, read as a duplicate. Not ON
		// DUPLICATE KEY UPDATE either: with the DSN's clientFoundRows an
		// unchanged duplicate counts as one affected row, like an insert.
		s.insert = "INSERT INTO " + qt + " (group_name, message_id, received_at) VALUES (?, ?, ?)"
		s.insertHead = "INSERT INTO " + qt + " (group_name, message_id, received_at) VALUES "
		s.dupIsError = true
		s.purge = "DELETE FROM " + qt + " WHERE received_at < ? ORDER BY received_at LIMIT ?"
	case SQLite:
		s.migrate = []string{
			"CREATE TABLE IF NOT EXISTS " + qt + ` (
	group_name  TEXT    NOT NULL,
	message_id  TEXT    NOT NULL,
	received_at INTEGER NOT NULL,
	PRIMARY KEY (group_name, message_id))`,
			"CREATE INDEX IF NOT EXISTS " + idx + " ON " + qt + " (received_at)",
		}
		s.insert = "INSERT INTO " + qt + " (group_name, message_id, received_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING"
		s.insertHead = "INSERT INTO " + qt + " (group_name, message_id, received_at) VALUES "
		s.insertTail = " ON CONFLICT DO NOTHING"
		s.returning = " RETURNING message_id"
		s.purge = "DELETE FROM " + qt + " WHERE rowid IN (SELECT rowid FROM " + qt + " WHERE received_at < ? LIMIT ?)"
	default:
		return statements{}, fmt.Errorf("inbox: unknown dialect %q", d.name)
	}
	return s, nil
}
