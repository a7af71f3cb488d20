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

// The upsert statements of Claim and of Complete's lost-lease path, per
// form of the dialect. Parameters are named (see params).
//
// claim upserts processing(@token) for @lease ms, taking the row only
// when it is absent, expired or processing(@token). With a writable CTE it
// returns one row (acquired, state, owner, expires_at - now), acquired
// being 1 when the statement took the row and 0 when the row is the one
// it did not take (a snapshot that may be stale), or no row, and the
// store reads the row; with RETURNING alone it returns the row it took
// (acquired 1) or none; otherwise it returns nothing and the store always
// reads the row afterwards.
//
// completeLost records done for @window ms unless a live record is there.
const (
	claimCTE = `WITH up AS (
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
WHERE {key} = @key AND NOT EXISTS (SELECT 1 FROM up)`

	claimReturning = `INSERT INTO {table} ({key}, state, owner, expires_at)
VALUES (@key, 'processing', @token, {now} + @lease)
ON CONFLICT ({key}) DO UPDATE
SET state = 'processing', owner = excluded.owner, expires_at = excluded.expires_at
WHERE expires_at <= {now} OR (state = 'processing' AND owner = excluded.owner)
RETURNING 1, state, owner, expires_at - {now}`

	completeLostOnConflict = `INSERT INTO {table} AS d ({key}, state, owner, expires_at)
VALUES (@key, 'done', '', {now} + @window)
ON CONFLICT ({key}) DO UPDATE
SET state = 'done', owner = '', expires_at = EXCLUDED.expires_at
WHERE d.expires_at <= {now}`

	// ON DUPLICATE KEY UPDATE assigns left to right: owner is assigned
	// first, and only when mysqlCond holds, and then it still holds through
	// expires_at, which is assigned last.
	claimOnDuplicateKey = `INSERT INTO {table} ({key}, state, owner, expires_at)
VALUES (@key, 'processing', @token, {now} + @lease)
ON DUPLICATE KEY UPDATE
	owner = IF(` + mysqlCond + `, @token, owner),
	state = IF(` + mysqlCond + `, 'processing', state),
	expires_at = IF(` + mysqlCond + `, {now} + @lease, expires_at)`
	mysqlCond = "(expires_at <= {now} OR (state = 'processing' AND owner = @token))"

	completeLostOnDuplicateKey = `INSERT INTO {table} ({key}, state, owner, expires_at)
VALUES (@key, 'done', '', {now} + @window)
ON DUPLICATE KEY UPDATE
	owner = IF(expires_at <= {now}, '', owner),
	state = IF(expires_at <= {now}, 'done', state),
	expires_at = IF(expires_at <= {now}, {now} + @window, expires_at)`
)

// purge deletes at most @batch rows expired for more than @grace ms; it
// skips rows a concurrent claim holds instead of waiting for them, where
// the dialect can.
var purge = sqldb.LimitedDelete{
	Table:      "{table}",
	Key:        "{key}",
	Where:      "expires_at <= {now} - @grace",
	Limit:      "@batch",
	SkipLocked: true,
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
	var claim, completeLost string
	s := statements{}
	switch {
	case d.Upsert == sqldb.OnConflict && d.WritableCTE:
		claim, completeLost, s.claimReturnsRow = claimCTE, completeLostOnConflict, true
	case d.Upsert == sqldb.OnConflict && d.Returning:
		claim, completeLost, s.claimReturnsRow = claimReturning, completeLostOnConflict, true
	case d.Upsert == sqldb.OnDuplicateKey:
		claim, completeLost = claimOnDuplicateKey, completeLostOnDuplicateKey
	default:
		return statements{}, fmt.Errorf("sqlstore: dialect %q has no upsert the store knows", d.Name)
	}
	vars := d.TableVars(table)
	vars["key"] = d.Quote("key")
	var errs []error
	c := func(tmpl string) sqldb.Stmt {
		st, err := d.Compile(tmpl, vars, params...)
		errs = append(errs, err)
		return st
	}
	s.claim = c(claim)
	s.read = c(readSQL)
	s.completeOwn = c(completeOwnSQL)
	s.completeLost = c(completeLost)
	s.release = c(releaseSQL)
	s.extend = c(extendSQL)
	s.owned = c(ownedSQL)
	s.get = c(getSQL)
	s.forget = c(forgetSQL)
	s.forgetIdle = c(forgetIdleSQL)
	s.purge = c(d.LimitedDelete(purge))
	s.stats = c(statsSQL)
	return s, errors.Join(errs...)
}
