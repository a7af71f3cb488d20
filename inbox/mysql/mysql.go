// Package mysql is the inbox's MySQL/MariaDB dialect over database/sql: the
// handler receives a *sql.Tx. It imports no driver: open db with
// github.com/go-sql-driver/mysql yourself.
//
// The inbox row is written with INSERT IGNORE into an InnoDB table whose
// key columns are VARBINARY (IDs compare byte for byte). A second delivery
// of an ID whose row is uncommitted waits on the row's lock
// (innodb_lock_wait_timeout, 50 s by default): a duplicate once the first
// commits, a fresh insert if it rolls back.
package mysql

import (
	"context"
	"database/sql"

	"github.com/idemq/idemq/inbox"
)

// Driver returns the inbox driver for a MySQL/MariaDB database.
func Driver(db *sql.DB) inbox.Driver[*sql.Tx] { return inbox.SQL(db, inbox.MySQL) }

// New creates (and migrates) an inbox on db.
func New(ctx context.Context, db *sql.DB, cfg inbox.Config) (*inbox.Inbox[*sql.Tx], error) {
	return inbox.New(ctx, Driver(db), cfg)
}
