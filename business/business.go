package business

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Row is one result row.
type Row interface {
	Scan(dest ...any) error
}

// Execer runs statements: a connection, a pool or a transaction.
type Execer interface {
	// Exec runs a statement and returns the number of rows affected.
	Exec(ctx context.Context, query string, args ...any) (int64, error)
	// QueryRow runs a query expected to return at most one row; Scan
	// returns [ErrNoRows] (or the driver's equivalent wrapped) when none.
	QueryRow(ctx context.Context, query string, args ...any) Row
}

// ErrNoRows is what an adapter's Row.Scan returns when the query found no
// row (adapters translate their driver's value: sql.ErrNoRows, pgx.ErrNoRows).
var ErrNoRows = errors.New("business: no rows")

// SQLConn is what [SQL] adapts: *sql.DB, *sql.Tx, *sql.Conn.
type SQLConn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// SQL adapts a database/sql handle to [Execer].
func SQL(c SQLConn) Execer { return sqlExecer{c} }

type sqlExecer struct{ c SQLConn }

func (s sqlExecer) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := s.c.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (s sqlExecer) QueryRow(ctx context.Context, q string, args ...any) Row {
	return sqlRow{s.c.QueryRowContext(ctx, q, args...)}
}

type sqlRow struct{ r *sql.Row }

func (r sqlRow) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: %w", ErrNoRows, err)
	}
	return err
}

// InsertOnce runs query, an INSERT that skips an existing row
// (INSERT ... ON CONFLICT DO NOTHING on PostgreSQL and SQLite, INSERT IGNORE
// on MySQL), and reports whether it inserted. A row that was already there
// is a success: inserted=false, err=nil. Any error is returned wrapped.
//
// Use it for the "create once" effects (createOrder): the redelivered
// message finds the row and moves on. On MySQL prefer a unique key and
// INSERT IGNORE only on strict tables (IGNORE also downgrades other errors
// to warnings).
func InsertOnce(ctx context.Context, e Execer, query string, args ...any) (inserted bool, err error) {
	n, err := e.Exec(ctx, query, args...)
	if err != nil {
		return false, fmt.Errorf("business: insert once: %w", err)
	}
	return n > 0, nil
}

// Dialect says how to write placeholders and quote identifiers.
type Dialect int

// The dialects.
const (
	Postgres Dialect = iota + 1
	MySQL            // and MariaDB
	SQLite
)

func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case MySQL:
		return "mysql"
	case SQLite:
		return "sqlite"
	}
	return "Dialect(" + strconv.Itoa(int(d)) + ")"
}

// Placeholder returns the n-th (1-based) bind parameter.
func (d Dialect) Placeholder(n int) string {
	if d == Postgres {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// ErrInvalidIdentifier: a table or column name that is not a plain SQL
// identifier (letters, digits, underscore; a table may be schema.table).
var ErrInvalidIdentifier = errors.New("business: invalid SQL identifier")

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Quote validates an identifier ("name" or, for tables, "schema.name") and
// quotes it for the dialect.
func (d Dialect) Quote(name string) (string, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("%w: %q", ErrInvalidIdentifier, name)
	}
	for i, p := range parts {
		if !identRE.MatchString(p) {
			return "", fmt.Errorf("%w: %q", ErrInvalidIdentifier, name)
		}
		if d == MySQL {
			parts[i] = "`" + p + "`"
		} else {
			parts[i] = `"` + p + `"`
		}
	}
	return strings.Join(parts, "."), nil
}
