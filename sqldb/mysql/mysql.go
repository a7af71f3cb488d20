// Package mysql is MySQL and MariaDB (InnoDB) for idemq's SQL layer
// ([sqldb]): its [Dialect] and [Std], a database/sql pool opened with
// github.com/go-sql-driver/mysql (which this package imports for its error
// type). It imports no other driver.
//
// The clock is UTC_TIMESTAMP(6) (time-zone and DST independent) and
// NOW(6) for the outbox's DATETIME columns; migrations serialise on
// GET_LOCK; a duplicate key is error 1062 (ER_DUP_ENTRY), which MySQL
// rolls back alone, leaving the transaction usable; a deadlock (1213) is
// retried. The DSN needs no particular option.
package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idemq/idemq/sqldb"
)

// MySQL error numbers idemq tells apart.
const (
	ErDupEntry    = 1062 // ER_DUP_ENTRY: a duplicate key
	erDupKeyName  = 1061 // ER_DUP_KEYNAME: the index exists
	erTableExists = 1050 // ER_TABLE_EXISTS_ERROR
	erLockDeadlck = 1213 // ER_LOCK_DEADLOCK
)

// LockTimeout is how long a migration waits for the migration lock.
const LockTimeout = 60 * time.Second

// Dialect returns the MySQL/MariaDB dialect.
func Dialect() *sqldb.Dialect {
	return &sqldb.Dialect{
		Name:          sqldb.MySQL,
		QuoteChar:     "`",
		Schemas:       true,
		NowMillis:     `(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)`,
		Now:           "NOW(6)",
		NowPlusMillis: func(ms string) string { return "(NOW(6) + INTERVAL (" + ms + " * 1000) MICROSECOND)" },
		AgeSeconds:    func(col string) string { return "(TIMESTAMPDIFF(MICROSECOND, " + col + ", NOW(6)) / 1000000.0)" },
		Time:          func(t time.Time) any { return t.UTC() },
		Lock:          lock,
		DuplicateKey:  IsDuplicateKey,
		Retryable:     func(err error) bool { return number(err) == erLockDeadlck },
		Exists: func(err error) bool {
			n := number(err)
			return n == erDupKeyName || n == erTableExists
		},
		ConnLost:    func(err error) bool { return errors.Is(err, gomysql.ErrInvalidConn) },
		Upsert:      sqldb.OnDuplicateKey,
		SkipLocked:  "FOR UPDATE SKIP LOCKED", // MySQL 8, MariaDB >= 10.6
		GapLocks:    true,
		DeleteLimit: true,
	}
}

// lock takes a named lock on tx's connection: GET_LOCK is a session lock,
// so it outlives a DDL's implicit commit and must be released before the
// connection goes back to the pool.
func lock(ctx context.Context, tx sqldb.Querier, name string) (func(context.Context), error) {
	var got sql.NullInt64
	if err := tx.QueryRow(ctx, "SELECT GET_LOCK(?, ?)", name, int(LockTimeout/time.Second)).Scan(&got); err != nil {
		return nil, err
	}
	if !got.Valid || got.Int64 != 1 {
		return nil, fmt.Errorf("mysql: could not take the lock %q within %v", name, LockTimeout)
	}
	return func(ctx context.Context) { _, _ = tx.Exec(ctx, "DO RELEASE_LOCK(?)", name) }, nil
}

func number(err error) uint16 {
	var me *gomysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// IsDuplicateKey reports whether err is (or wraps) a *mysql.MySQLError
// number 1062.
func IsDuplicateKey(err error) bool { return number(err) == ErDupEntry }

// Std adapts a database/sql pool opened with the "mysql" driver. The
// caller keeps owning db.
func Std(db *sql.DB) sqldb.Native[*sql.Tx] { return sqldb.Std(db, Dialect()) }
