// Package dburl opens a database of any dialect idemq speaks from one
// connection string: [Parse] tells the dialect from the string's form (or
// takes it named) and turns the string into what the dialect's driver
// takes; [Open] opens it through the dialect package (a pgx pool for
// PostgreSQL, database/sql for MySQL and SQLite). It is for tools that
// take any database, such as the idemq command, and so imports every
// dialect package and every driver; a program that knows its database
// imports only its own dialect package.
//
// The forms it tells apart (schemes are case-insensitive):
//
//	postgres://…, postgresql://…      PostgreSQL, as written (pgx)
//	mysql://… or mariadb://…          MySQL: a go-sql-driver DSN after the scheme
//	                                  (mysql://user:pass@tcp(host:3306)/db) or a URL
//	                                  (mysql://user:pass@host:3306/db?params; port 3306 by default)
//	user:pass@tcp(host:3306)/db       MySQL: a go-sql-driver DSN (also @unix(…), @/db, tcp(…), unix(…))
//	sqlite://path, sqlite:path, file:path   SQLite (sqlite3 for sqlite too)
//
// Any other string needs its dialect named: a PostgreSQL keyword/value
// string (host=… user=…) with postgres, a plain SQLite path with sqlite.
// A string whose form says nothing is refused ([ErrForm]), never opened
// as a SQLite file named after it. Errors never show a password: the
// string is redacted (internal/redact) wherever it appears.
package dburl

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/mysql"
	"github.com/idemq/idemq/sqldb/postgres"
	"github.com/idemq/idemq/sqldb/sqlite"
)

var (
	// ErrDialect: a dialect name that is none of postgres (postgresql,
	// pg), mysql (mariadb) or sqlite (sqlite3).
	ErrDialect = errors.New("dburl: unknown dialect")
	// ErrForm: the string's form does not say which database it is, and
	// no dialect was named.
	ErrForm = errors.New("cannot tell which database this is")
	// ErrNotSQLite: a string named SQLite that is not a SQLite path or
	// file: URI (a URL or DSN of another database would become a file
	// named after it, password and all).
	ErrNotSQLite = errors.New("not a SQLite path")
	// ErrEmptyPath: a SQLite form with no path.
	ErrEmptyPath = errors.New("empty SQLite path")
)

// Error is a connection string [Parse] refuses or [Open] cannot open.
type Error struct {
	// Op is "parse" or "open".
	Op string
	// DSN is the string (as given to Parse, as resolved for Open) with
	// its secrets hidden.
	DSN string
	// Err is why: [ErrForm], [ErrNotSQLite], [ErrEmptyPath], or the
	// driver's own refusal of the string.
	Err error
}

func (e *Error) Error() string { return "dburl: " + e.Op + " " + e.DSN + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Dialect returns the dialect named name (case-insensitive): [sqldb.Postgres]
// for postgres, postgresql or pg, [sqldb.MySQL] for mysql or mariadb,
// [sqldb.SQLite] for sqlite or sqlite3, and "" for "". Any other name is
// an error wrapping [ErrDialect].
func Dialect(name string) (string, error) {
	switch n := strings.ToLower(name); n {
	case "", sqldb.Postgres, sqldb.MySQL, sqldb.SQLite:
		return n, nil
	case "postgresql", "pg":
		return sqldb.Postgres, nil
	case "mariadb":
		return sqldb.MySQL, nil
	case "sqlite3":
		return sqldb.SQLite, nil
	}
	return "", fmt.Errorf("%w %q: want postgres, mysql or sqlite", ErrDialect, strings.ToLower(name))
}

// Target is a resolved database: its dialect and the string its driver
// opens.
type Target struct {
	// Dialect is [sqldb.Postgres], [sqldb.MySQL] or [sqldb.SQLite].
	Dialect string
	// DSN is what the dialect's driver takes: a PostgreSQL URL or
	// keyword/value string, a go-sql-driver DSN, a SQLite path or file:
	// URI.
	DSN string
}

// Redacted is the DSN with its secrets hidden, for logs and errors.
func (t Target) Redacted() string { return redact.DSN(t.DSN) }

// Parse resolves s, a URL or DSN in one of the package's forms, to a
// [Target]. dialect names the database ([Dialect]; "": tell it from s's
// form). Its errors are [*Error] (their Err [ErrForm], [ErrNotSQLite],
// [ErrEmptyPath] or the MySQL driver's refusal) or wrap [ErrDialect].
func Parse(s, dialect string) (Target, error) {
	dialect, err := Dialect(dialect)
	if err != nil {
		return Target{}, err
	}
	if s == "" {
		return Target{}, errors.New("dburl: empty connection string")
	}
	refuse := func(err error) (Target, error) {
		return Target{}, &Error{Op: "parse", DSN: redact.DSN(s), Err: err}
	}
	guessed := guess(s)
	if dialect == "" {
		if guessed == "" {
			return refuse(ErrForm)
		}
		dialect = guessed
	}
	switch dialect {
	case sqldb.Postgres:
		return Target{dialect, s}, nil
	case sqldb.SQLite:
		path := s
		lower := strings.ToLower(s)
		for _, p := range []string{"sqlite://", "sqlite3://", "sqlite:", "sqlite3:"} {
			if strings.HasPrefix(lower, p) {
				path = s[len(p):]
				break
			}
		}
		if guessed != "" && guessed != sqldb.SQLite || strings.Contains(path, "://") || strings.ContainsAny(path, "@") ||
			(guessed == "" && strings.Contains(path, "=")) {
			return refuse(ErrNotSQLite)
		}
		if path == "" {
			return refuse(ErrEmptyPath)
		}
		return Target{dialect, path}, nil
	}
	dsn, err := mysqlDSN(s)
	if err != nil {
		return refuse(err)
	}
	return Target{sqldb.MySQL, dsn}, nil
}

// guess tells the dialect from the string's own form, "" when it cannot:
// only explicit forms count (a scheme, a go-sql-driver net(addr)).
func guess(s string) string {
	lower := strings.ToLower(strings.TrimSpace(s))
	has := func(prefixes ...string) bool {
		for _, p := range prefixes {
			if strings.HasPrefix(lower, p) {
				return true
			}
		}
		return false
	}
	switch {
	case has("postgres://", "postgresql://"):
		return sqldb.Postgres
	case has("mysql://", "mariadb://"):
		return sqldb.MySQL
	case has("sqlite://", "sqlite3://", "sqlite:", "sqlite3:", "file:"):
		return sqldb.SQLite
	case strings.Contains(s, "://"):
		return ""
	case strings.Contains(s, "@tcp("), strings.Contains(s, "@unix("), strings.Contains(s, "@/"),
		has("tcp(", "unix("):
		return sqldb.MySQL
	}
	return ""
}

// mysqlDSN accepts a go-sql-driver DSN with or without a mysql:// scheme, or
// a mysql://user:pass@host:port/db?params URL.
func mysqlDSN(s string) (string, error) {
	rest := s
	for _, p := range []string{"mysql://", "mariadb://"} {
		if strings.HasPrefix(strings.ToLower(rest), p) {
			rest = rest[len(p):]
			break
		}
	}
	if strings.Contains(rest, "@tcp(") || strings.Contains(rest, "@unix(") || !strings.Contains(s, "://") {
		if _, err := gomysql.ParseDSN(rest); err != nil {
			return "", fmt.Errorf("MySQL DSN: %w", err)
		}
		return rest, nil
	}
	u, err := url.Parse("mysql://" + rest)
	if err != nil {
		return "", fmt.Errorf("MySQL URL: %w", redactedError{err})
	}
	c := gomysql.NewConfig()
	c.Net = "tcp"
	c.Addr = u.Host
	if u.Port() == "" {
		c.Addr = u.Hostname() + ":3306"
	}
	if u.User != nil {
		c.User = u.User.Username()
		c.Passwd, _ = u.User.Password()
	}
	c.DBName = strings.TrimPrefix(u.Path, "/")
	dsn := c.FormatDSN()
	if u.RawQuery != "" {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + u.RawQuery
	}
	if _, err := gomysql.ParseDSN(dsn); err != nil {
		return "", fmt.Errorf("MySQL URL: %w", err)
	}
	return dsn, nil
}

// redactedError keeps the chain of err but prints it redacted (a URL
// parse error quotes the URL, password and all).
type redactedError struct{ err error }

func (e redactedError) Error() string { return redact.Text(e.err.Error()) }
func (e redactedError) Unwrap() error { return e.err }

// Open opens t through its dialect package: a pgx pool
// (postgres.Pgx), or a database/sql pool (mysql.Std; sqlite.Std over
// sqlite.Open, which sets the options idemq needs). Nothing connects
// yet. The caller calls the returned function to close it. A string the
// driver refuses is an [*Error].
func Open(ctx context.Context, t Target) (sqldb.DB, func(), error) {
	switch t.Dialect {
	case sqldb.Postgres:
		cfg, err := pgxpool.ParseConfig(t.DSN)
		if err != nil {
			return nil, nil, &Error{Op: "open", DSN: t.Redacted(), Err: err}
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, nil, &Error{Op: "open", DSN: t.Redacted(), Err: err}
		}
		return postgres.Pgx(pool), pool.Close, nil
	case sqldb.MySQL:
		db, err := sql.Open("mysql", t.DSN)
		if err != nil {
			return nil, nil, &Error{Op: "open", DSN: t.Redacted(), Err: err}
		}
		return mysql.Std(db), func() { _ = db.Close() }, nil
	case sqldb.SQLite:
		db, err := sqlite.Open(t.DSN)
		if err != nil {
			return nil, nil, err // it names the file
		}
		return sqlite.Std(db), func() { _ = db.Close() }, nil
	}
	return nil, nil, fmt.Errorf("%w %q: want postgres, mysql or sqlite", ErrDialect, t.Dialect)
}

// Listener returns what wakes an outbox relay as soon as a row commits
// (outbox.StoreConfig.Listen): postgres.Listener(t.DSN) on PostgreSQL,
// nil elsewhere (the relay polls).
func (t Target) Listener() func(ctx context.Context, channel string, wake func()) error {
	if t.Dialect != sqldb.Postgres {
		return nil
	}
	return postgres.Listener(t.DSN)
}
