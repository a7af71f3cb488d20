package inbox

import (
	"context"
	"database/sql"
	"fmt"
)

// Driver runs the inbox's statements in transactions of type T: pgx.Tx for
// pgx (inbox/postgres), *sql.Tx for database/sql ([SQL]). The user's handler
// receives the same T.
//
// A driver may also have a method
//
//	QueryStrings(ctx context.Context, tx T, query string, args ...any) ([]string, error)
//
// that runs a query in tx and returns its single text column. The batch
// inbox ([Inbox.Batch]) then learns which of a batch's inbox rows were
// already there from one INSERT ... RETURNING on PostgreSQL and SQLite
// (without it, a batch holding a duplicate takes the slower path of a
// savepoint per delivery). Both drivers of this module have it.
type Driver[T any] interface {
	Dialect() Dialect
	// Begin opens a transaction.
	Begin(ctx context.Context) (T, error)
	// Exec runs one statement in tx and returns the rows affected.
	Exec(ctx context.Context, tx T, query string, args ...any) (int64, error)
	Commit(ctx context.Context, tx T) error
	Rollback(ctx context.Context, tx T) error
}

// DuplicateKeyReporter is a capability a [Driver] for the MySQL dialect
// must have: the MySQL inbox writes its row with a plain INSERT, and a
// duplicate is the statement failing with a duplicate-key error (MySQL
// error 1062, ER_DUP_ENTRY), told from every other failure by
// IsDuplicateKey. Any other error fails the delivery. inbox/mysql's driver
// has it; [New] refuses a MySQL driver without it. A driver that wraps
// another (tracing, say) must forward it.
type DuplicateKeyReporter interface {
	IsDuplicateKey(err error) bool
}

// queryDriver is the optional capability of a [Driver] described there.
type queryDriver[T any] interface {
	QueryStrings(ctx context.Context, tx T, query string, args ...any) ([]string, error)
}

// SQLBeginner is what [SQL] needs: *sql.DB (or *sql.Conn).
type SQLBeginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// SQL returns a database/sql [Driver] for dialect d: PostgreSQL through
// pgx/v5/stdlib, MySQL/MariaDB through go-sql-driver/mysql, SQLite through
// modernc.org/sqlite. It imports no driver; the caller opens db. For MySQL
// use inbox/mysql's driver instead, which adds the [DuplicateKeyReporter]
// the MySQL dialect needs. For SQLite
// open db with [SQLiteDSN]-style options (busy_timeout, _txlock=immediate):
// see package inbox/sqlite.
func SQL(db SQLBeginner, d Dialect) Driver[*sql.Tx] {
	return sqlDriver{db: db, d: d}
}

var _ queryDriver[*sql.Tx] = sqlDriver{}

type sqlDriver struct {
	db SQLBeginner
	d  Dialect
}

func (s sqlDriver) Dialect() Dialect { return s.d }

func (s sqlDriver) Begin(ctx context.Context) (*sql.Tx, error) {
	return s.db.BeginTx(ctx, nil)
}

func (s sqlDriver) Exec(ctx context.Context, tx *sql.Tx, query string, args ...any) (int64, error) {
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("rows affected: %w", err)
	}
	return n, nil
}

func (s sqlDriver) Commit(_ context.Context, tx *sql.Tx) error   { return tx.Commit() }
func (s sqlDriver) Rollback(_ context.Context, tx *sql.Tx) error { return tx.Rollback() }

// QueryStrings runs query in tx and returns its single text column.
func (s sqlDriver) QueryStrings(ctx context.Context, tx *sql.Tx, query string, args ...any) ([]string, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}
