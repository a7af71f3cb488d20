package inbox

import (
	"fmt"
	"strings"

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

// statements is the SQL an Inbox runs, built once per table.
type statements struct {
	insert string
	purge  string

	// The batch inbox's multi-row insert: insertHead, then one
	// "(group, id, received_at)" tuple of placeholders per row, then
	// insertTail. returning, when not empty, is appended to make the
	// statement return the message_id of each row it inserted (PostgreSQL
	// and SQLite; MySQL has no INSERT ... RETURNING).
	insertHead, insertTail, returning string

	// insertArray, when not empty, is the batch inbox's insert of one
	// group's rows as one statement whatever their number (PostgreSQL):
	// $1 the group, $2 the message IDs as a text[], $3 received_at; it
	// returns the message_id of each row it inserted. One statement text
	// for every batch size, so the driver prepares it once per connection
	// (a VALUES list per row count would be prepared again for each new
	// count: an extra round trip and a plan of up to 1500 parameters).
	insertArray string

	// dupIsError: insert and the multi-row insert fail on an existing row
	// (MySQL) instead of skipping it; the dialect's DuplicateKey tells that
	// failure from any other.
	dupIsError bool
}

func compile(d *sqldb.Dialect, table string) (statements, error) {
	qt, err := d.QuoteTable(table)
	if err != nil {
		return statements{}, err
	}
	s := statements{insertHead: "INSERT INTO " + qt + " (group_name, message_id, received_at) VALUES "}
	switch d.Name {
	case sqldb.Postgres, sqldb.SQLite:
		s.insertTail = " ON CONFLICT DO NOTHING"
		s.returning = " RETURNING message_id"
	case sqldb.MySQL:
		// A plain INSERT: the driver reports a duplicate key as error 1062,
		// which in MySQL rolls back only the statement. Not INSERT IGNORE,
		// which turns every error (a value truncated or converted, a CHECK
		// failure, ...) into a warning and stores a mangled key or none,
		// read as a duplicate. Not ON DUPLICATE KEY UPDATE either: with the
		// DSN's clientFoundRows an unchanged duplicate counts as one
		// affected row, like an insert.
		s.dupIsError = true
	default:
		return statements{}, fmt.Errorf("inbox: unknown dialect %q", d.Name)
	}
	s.insert = d.Rebind(s.insertHead + "(?, ?, ?)" + s.insertTail)
	switch d.Name {
	case sqldb.Postgres:
		// unnest returns the IDs in array order: rows are inserted (and
		// their locks taken) in the batch's sorted order.
		s.insertArray = "INSERT INTO " + qt + " (group_name, message_id, received_at) SELECT $1::text, m, $3::timestamptz FROM unnest($2::text[]) AS u(m) ON CONFLICT DO NOTHING RETURNING message_id"
		s.purge = "DELETE FROM " + qt + " WHERE (group_name, message_id) IN (SELECT group_name, message_id FROM " + qt + " WHERE received_at < $1 LIMIT $2)"
	case sqldb.MySQL:
		s.purge = "DELETE FROM " + qt + " WHERE received_at < ? ORDER BY received_at LIMIT ?"
	case sqldb.SQLite:
		s.purge = "DELETE FROM " + qt + " WHERE rowid IN (SELECT rowid FROM " + qt + " WHERE received_at < ? LIMIT ?)"
	}
	return s, nil
}

// insertRows returns the multi-row INSERT of n rows.
func (s *statements) insertRows(d *sqldb.Dialect, n int, returning bool) string {
	var sb strings.Builder
	sb.WriteString(s.insertHead)
	for i := 0; i < n; i++ {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString("(" + d.Placeholder(3*i+1) + ", " + d.Placeholder(3*i+2) + ", " + d.Placeholder(3*i+3) + ")")
	}
	sb.WriteString(s.insertTail)
	if returning {
		sb.WriteString(s.returning)
	}
	return sb.String()
}
