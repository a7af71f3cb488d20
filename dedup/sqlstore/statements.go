package sqlstore

import (
	"errors"
	"fmt"

	"github.com/idemq/idemq/sqldb"
)

// Component names the dedup table in the migrations table.
const Component = "dedup"

// Schema returns the migrations of the dedup table named table, for
// [sqldb.Up] and `idemq migrate`.
//
//	key        the opaque guard key, primary key, compared byte for byte
//	           (PostgreSQL text COLLATE "C", MySQL VARBINARY(1024), SQLite
//	           TEXT with BINARY collation)
//	state      'processing' or 'done'
//	owner      the lease holder's token ('' for done)
//	expires_at end of the lease or of the dedup window, Unix milliseconds
//	           of the database's clock
//
// Version 1 creates the table, version 2 its expiry index (for the purge).
func Schema(table string) sqldb.Schema {
	return sqldb.Schema{Component: Component, Table: table, Migrations: []sqldb.Migration{
		{Version: 1, Name: "create table", Up: map[string][]string{
			sqldb.Postgres: {`CREATE TABLE IF NOT EXISTS {table} (
	"key"      text COLLATE "C" PRIMARY KEY,
	state      text NOT NULL CHECK (state IN ('processing', 'done')),
	owner      text NOT NULL DEFAULT '',
	expires_at bigint NOT NULL
)`},
			sqldb.MySQL: {"CREATE TABLE IF NOT EXISTS {table} (" + `
	` + "`key`" + `   VARBINARY(1024) NOT NULL,
	state      VARCHAR(10) CHARACTER SET ascii NOT NULL,
	owner      VARBINARY(1024) NOT NULL DEFAULT '',
	expires_at BIGINT NOT NULL,
	PRIMARY KEY (` + "`key`" + `)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC`},
			sqldb.SQLite: {`CREATE TABLE IF NOT EXISTS {table} (
	"key"      TEXT PRIMARY KEY,
	state      TEXT NOT NULL CHECK (state IN ('processing', 'done')),
	owner      TEXT NOT NULL DEFAULT '',
	expires_at INTEGER NOT NULL
) WITHOUT ROWID`},
		}},
		{Version: 2, Name: "expiry index", Up: sqldb.Index("_expires_idx", "expires_at")},
	}}
}

// dialectSQL is what differs between the dialects: the claim upsert, the
// lost-lease upsert of Complete and the purge. Parameters are named (see
// params).
type dialectSQL struct {
	// claim upserts processing(@token) for @lease ms, taking the row only
	// when it is absent, expired or processing(@token).
	claim string
	// claimReturnsRow: claim returns one row (acquired, state, owner,
	// expires_at - now), acquired being 1 when the statement took the row
	// and 0 when the row is the one it did not take (a snapshot that may be
	// stale); or no row, and the store reads the row. Otherwise claim is
	// executed and the store always reads the row afterwards.
	claimReturnsRow bool
	// completeLost records done for @window ms unless a live record is
	// there: the lost-lease path of Complete.
	completeLost string
	// purge deletes at most @batch rows expired for more than @grace ms.
	purge string
}

// mysqlCond: the claim may take the row (evaluated on the row before the
// update: owner is assigned first, and only when it holds, and then it
// still holds through expires_at, which is assigned last).
const mysqlCond = "(expires_at <= {now} OR (state = 'processing' AND owner = @token))"

var dialects = map[string]dialectSQL{
	sqldb.Postgres: {
		claim: `WITH up AS (
	INSERT INTO {table} AS d ({key}, state, owner, expires_at)
	VALUES (@key, 'processing', @token, {now} + @lease)
	ON CONFLICT ({key}) DO UPDATE
	SET state = 'processing', owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
	WHERE d.expires_at <= {now} OR (d.state = 'processing' AND d.owner = EXCLUDED.owner)
	RETURNING d.state, d.owner, d.expires_at - {now} AS left_ms
)
SELECT 1, state, owner, left_ms FROM up
UNION ALL
SELECT 0, state, owner, expires_at - {now} FROM {table}
WHERE {key} = @key AND NOT EXISTS (SELECT 1 FROM up)`,
		claimReturnsRow: true,
		completeLost: `INSERT INTO {table} AS d ({key}, state, owner, expires_at)
VALUES (@key, 'done', '', {now} + @window)
ON CONFLICT ({key}) DO UPDATE
SET state = 'done', owner = '', expires_at = EXCLUDED.expires_at
WHERE d.expires_at <= {now}`,
		// SKIP LOCKED: skip rows a concurrent claim holds instead of
		// waiting for them; the expiry of every deleted row is checked again.
		purge: `DELETE FROM {table} WHERE {key} IN (
	SELECT {key} FROM {table} WHERE expires_at <= {now} - @grace LIMIT @batch FOR UPDATE SKIP LOCKED
) AND expires_at <= {now} - @grace`,
	},
	sqldb.MySQL: {
		claim: `INSERT INTO {table} ({key}, state, owner, expires_at)
VALUES (@key, 'processing', @token, {now} + @lease)
ON DUPLICATE KEY UPDATE
	owner = IF(` + mysqlCond + `, @token, owner),
	state = IF(` + mysqlCond + `, 'processing', state),
	expires_at = IF(` + mysqlCond + `, {now} + @lease, expires_at)`,
		completeLost: `INSERT INTO {table} ({key}, state, owner, expires_at)
VALUES (@key, 'done', '', {now} + @window)
ON DUPLICATE KEY UPDATE
	owner = IF(expires_at <= {now}, '', owner),
	state = IF(expires_at <= {now}, 'done', state),
	expires_at = IF(expires_at <= {now}, {now} + @window, expires_at)`,
		purge: `DELETE FROM {table} WHERE expires_at <= {now} - @grace LIMIT @batch`,
	},
	sqldb.SQLite: {
		claim: `INSERT INTO {table} ({key}, state, owner, expires_at)
VALUES (@key, 'processing', @token, {now} + @lease)
ON CONFLICT ({key}) DO UPDATE
SET state = 'processing', owner = excluded.owner, expires_at = excluded.expires_at
WHERE expires_at <= {now} OR (state = 'processing' AND owner = excluded.owner)
RETURNING 1, state, owner, expires_at - {now}`,
		claimReturnsRow: true,
		completeLost: `INSERT INTO {table} ({key}, state, owner, expires_at)
VALUES (@key, 'done', '', {now} + @window)
ON CONFLICT ({key}) DO UPDATE
SET state = 'done', owner = '', expires_at = excluded.expires_at
WHERE expires_at <= {now}`,
		purge: `DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} WHERE expires_at <= {now} - @grace LIMIT @batch)`,
	},
}

// The statements' named parameters, in the order their values are passed.
var params = []string{"key", "token", "lease", "window", "batch", "grace"}

const (
	argKey = iota
	argToken
	argLease
	argWindow
	argBatch
	argGrace
	numArgs
)

// Dialect-neutral statements.
const (
	readSQL        = `SELECT state, owner, expires_at - {now} FROM {table} WHERE {key} = @key`
	completeOwnSQL = `UPDATE {table} SET state = 'done', owner = '', expires_at = {now} + @window` +
		` WHERE {key} = @key AND state = 'processing' AND owner = @token AND expires_at > {now}`
	releaseSQL = `DELETE FROM {table} WHERE {key} = @key AND state = 'processing' AND owner = @token AND expires_at > {now}`
	extendSQL  = `UPDATE {table} SET expires_at = {now} + @lease` +
		` WHERE {key} = @key AND state = 'processing' AND owner = @token AND expires_at > {now}`
	ownedSQL  = `SELECT COUNT(*) FROM {table} WHERE {key} = @key AND state = 'processing' AND owner = @token AND expires_at > {now}`
	getSQL    = `SELECT state, owner, expires_at FROM {table} WHERE {key} = @key AND expires_at > {now}`
	forgetSQL = `DELETE FROM {table} WHERE {key} = @key`
	// forgetIdleSQL deletes the row unless it is a live lease.
	forgetIdleSQL = `DELETE FROM {table} WHERE {key} = @key AND NOT (state = 'processing' AND expires_at > {now})`
	statsSQL      = `SELECT` +
		` COALESCE(SUM(CASE WHEN expires_at > {now} AND state = 'processing' THEN 1 ELSE 0 END), 0),` +
		` COALESCE(SUM(CASE WHEN expires_at > {now} AND state = 'done' THEN 1 ELSE 0 END), 0),` +
		` COALESCE(SUM(CASE WHEN expires_at <= {now} THEN 1 ELSE 0 END), 0)` +
		` FROM {table}`
)

// statements is the SQL one Store runs, compiled once.
type statements struct {
	claimReturnsRow bool

	claim, read, completeOwn, completeLost, release, extend, owned,
	get, forget, forgetIdle, purge, stats sqldb.Stmt
}

func compile(d *sqldb.Dialect, table string) (statements, error) {
	ds, ok := dialects[d.Name]
	if !ok {
		return statements{}, fmt.Errorf("sqlstore: unknown dialect %q", d.Name)
	}
	vars := d.TableVars(table)
	vars["key"] = d.Quote("key")
	var errs []error
	c := func(tmpl string) sqldb.Stmt {
		st, err := d.Compile(tmpl, vars, params...)
		errs = append(errs, err)
		return st
	}
	s := statements{
		claimReturnsRow: ds.claimReturnsRow,
		claim:           c(ds.claim),
		read:            c(readSQL),
		completeOwn:     c(completeOwnSQL),
		completeLost:    c(ds.completeLost),
		release:         c(releaseSQL),
		extend:          c(extendSQL),
		owned:           c(ownedSQL),
		get:             c(getSQL),
		forget:          c(forgetSQL),
		forgetIdle:      c(forgetIdleSQL),
		purge:           c(ds.purge),
		stats:           c(statsSQL),
	}
	return s, errors.Join(errs...)
}
