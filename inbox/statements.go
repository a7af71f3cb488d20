package inbox

import (
	"errors"
	"fmt"

	"github.com/idemq/idemq/sqldb"
)

// Component names the inbox table in the migrations table.
const Component = "inbox"

// Schema returns the migrations of the inbox table named table, for
// [sqldb.Up] and `idemq migrate`: version 1 creates the table (primary key
// (group_name, message_id); VARBINARY on MySQL, so IDs compare byte for
// byte), version 2 the received_at index the purge uses.
func Schema(table string) sqldb.Schema {
	return sqldb.Schema{Component: Component, Table: table, Migrations: []sqldb.Migration{
		{Version: 1, Name: "create table", Up: map[string][]string{
			sqldb.Postgres: {`CREATE TABLE IF NOT EXISTS {table} (
	group_name  text        NOT NULL,
	message_id  text        NOT NULL,
	received_at timestamptz NOT NULL,
	PRIMARY KEY (group_name, message_id))`},
			// VARBINARY: IDs compare byte for byte (no case folding, no
			// trailing-space padding as the default collations do).
			sqldb.MySQL: {`CREATE TABLE IF NOT EXISTS {table} (
	group_name  VARBINARY(255) NOT NULL,
	message_id  VARBINARY(255) NOT NULL,
	received_at DATETIME(6)    NOT NULL,
	PRIMARY KEY (group_name, message_id)) ENGINE=InnoDB`},
			sqldb.SQLite: {`CREATE TABLE IF NOT EXISTS {table} (
	group_name  TEXT    NOT NULL,
	message_id  TEXT    NOT NULL,
	received_at INTEGER NOT NULL,
	PRIMARY KEY (group_name, message_id))`},
		}},
		{Version: 2, Name: "received_at index", Up: sqldb.Index("_received_idx", "received_at")},
	}}
}

// statements is the SQL an Inbox runs, compiled once per table.
type statements struct {
	// insert writes one row: @group, @id, @at.
	insert sqldb.Stmt
	// purge deletes at most @batch rows received before @cutoff.
	purge sqldb.Stmt
	// probe is a write that matches no row (Probe): a database that
	// refuses writes fails it.
	probe sqldb.Stmt

	// rows and rowsReturning are the batch inbox's multi-row insert of n
	// rows (@group<i>, @id<i>, @at<i>), the latter returning the
	// message_id of each row it inserted (nil without RETURNING).
	rows, rowsReturning *sqldb.List

	// insertArray, when not nil, is the batch inbox's insert of one
	// group's rows as one statement whatever their number (a dialect with
	// arrays): @group, @ids (the message IDs as one array), @at; it
	// returns the message_id of each row it inserted. One statement text
	// for every batch size, so the driver prepares it once per connection
	// (a VALUES list per row count would be prepared again for each new
	// count: an extra round trip and a plan of up to 1500 parameters).
	insertArray *sqldb.Stmt

	// dupIsError: insert and the multi-row insert fail on an existing row
	// (a dialect without ON CONFLICT DO NOTHING: MySQL) instead of skipping
	// it; the dialect's DuplicateKey tells that failure from any other.
	dupIsError bool
}

const insertHead = "INSERT INTO {table} (group_name, message_id, received_at) "

// purgeRows is the purge: at most @batch rows received before @cutoff.
var purgeRows = sqldb.LimitedDelete{
	Table:       "{table}",
	Key:         "group_name, message_id",
	RowID:       true,
	Where:       "received_at < @cutoff",
	StableOrder: "received_at",
	Limit:       "@batch",
}

func compile(d *sqldb.Dialect, table string) (statements, error) {
	if err := d.CheckTable(table); err != nil {
		return statements{}, err
	}
	var s statements
	tail := ""
	switch d.Upsert {
	case sqldb.OnConflict:
		tail = " ON CONFLICT DO NOTHING"
	case sqldb.OnDuplicateKey:
		// A plain INSERT: the driver reports a duplicate key as error 1062,
		// which in MySQL rolls back only the statement. Not INSERT IGNORE,
		// which turns every error (a value truncated or converted, a CHECK
		// failure, ...) into a warning and stores a mangled key or none,
		// read as a duplicate. Not ON DUPLICATE KEY UPDATE either: with the
		// DSN's clientFoundRows an unchanged duplicate counts as one
		// affected row, like an insert.
		s.dupIsError = true
	default:
		return statements{}, fmt.Errorf("inbox: dialect %q has no insert the inbox knows", d.Name)
	}
	vars := d.TableVars(table)
	var errs []error
	c := func(tmpl string, params ...string) sqldb.Stmt {
		st, err := d.Compile(tmpl, vars, params...)
		errs = append(errs, err)
		return st
	}
	s.insert = c(insertHead+"VALUES (@group, @id, @at)"+tail, "group", "id", "at")
	s.purge = c(d.LimitedDelete(purgeRows), "cutoff", "batch")
	s.probe = c("DELETE FROM {table} WHERE 1 = 0")
	if d.Arrays && d.Returning {
		// unnest returns the IDs in array order: rows are inserted (and
		// their locks taken) in the batch's sorted order.
		st := c(insertHead+"SELECT @group::text, m, @at::timestamptz FROM unnest(@ids::text[]) AS u(m)"+tail+" RETURNING message_id",
			"group", "ids", "at")
		s.insertArray = &st
	}
	rows := func(returning string) *sqldb.List {
		return sqldb.NewList(func(n int) (sqldb.Stmt, error) {
			list, params := sqldb.Repeat("(@group, @id, @at)", n)
			return d.Compile(insertHead+"VALUES "+list+tail+returning, vars, params...)
		})
	}
	s.rows = rows("")
	if d.Returning {
		s.rowsReturning = rows(" RETURNING message_id")
	}
	return s, errors.Join(errs...)
}
