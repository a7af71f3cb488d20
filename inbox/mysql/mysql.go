// Package mysql is the inbox's MySQL/MariaDB dialect over database/sql: the
// handler receives a *sql.Tx. Open db with github.com/go-sql-driver/mysql
// (this package imports it for its error type).
//
// The inbox row is written with a plain INSERT into an InnoDB table whose
// key columns are VARBINARY (IDs compare byte for byte); a duplicate is
// the statement failing with ER_DUP_ENTRY (1062), which MySQL rolls back
// alone, leaving the transaction usable. Any other failure — a value that
// does not fit a user-managed column, a character its charset cannot hold,
// a CHECK constraint — fails the delivery (failure policy, then the DLQ);
// it is never acked as a duplicate, as INSERT IGNORE did. Duplicate
// detection does not depend on the DSN's clientFoundRows.
//
// The default table (VARBINARY(255) columns) holds every valid group and
// ID byte for byte, whatever the sql_mode. A table you manage yourself
// (Config.SkipMigrate) with narrower or non-binary columns needs a strict
// sql_mode (STRICT_TRANS_TABLES, the default of MySQL >= 5.7 and MariaDB
// >= 10.2.4): without it MySQL truncates or converts the value with a
// warning even on a plain INSERT, and two IDs could share one row.
//
// A second delivery of an ID whose row is uncommitted waits on the row's
// lock (innodb_lock_wait_timeout, 50 s by default): a duplicate once the
// first commits, a fresh insert if it rolls back.
package mysql

import (
	"context"
	"database/sql"
	"errors"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idemq/idemq/inbox"
)

// ErDupEntry is MySQL's error number for a duplicate key (ER_DUP_ENTRY).
const ErDupEntry = 1062

// Driver returns the inbox driver for a MySQL/MariaDB database.
func Driver(db *sql.DB) inbox.Driver[*sql.Tx] { return driver{inbox.SQL(db, inbox.MySQL)} }

// driver adds the duplicate-key check to the database/sql driver.
type driver struct{ inbox.Driver[*sql.Tx] }

var _ inbox.DuplicateKeyReporter = driver{}

// IsDuplicateKey reports whether err is (or wraps) a go-sql-driver error
// number 1062.
func (driver) IsDuplicateKey(err error) bool {
	var me *gomysql.MySQLError
	return errors.As(err, &me) && me.Number == ErDupEntry
}

// New creates (and migrates) an inbox on db.
func New(ctx context.Context, db *sql.DB, cfg inbox.Config) (*inbox.Inbox[*sql.Tx], error) {
	return inbox.New(ctx, Driver(db), cfg)
}
