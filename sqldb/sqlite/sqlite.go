// Package sqlite is SQLite for idemq's SQL layer ([sqldb]) through
// modernc.org/sqlite (no cgo; this package imports and so registers it):
// its [Dialect], [Std], and [DSN] and [Open] with the options idemq needs
// under concurrency. It imports no other driver.
//
// SQLite has one writer at a time. Open the database with [DSN] so that
//   - every transaction starts with BEGIN IMMEDIATE (_txlock=immediate): it
//     takes the write lock up front, so two deliveries of one ID serialise
//     at BEGIN, and a deferred transaction never fails to upgrade its read
//     lock (SQLITE_BUSY mid-transaction);
//   - a writer waits for the lock instead of failing (busy_timeout);
//   - readers do not block the writer (journal_mode=WAL).
//
// The clock is julianday('now') — for an embedded database, the clock of
// the host running the process. Table names are not schema-qualified.
package sqlite

import (
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"modernc.org/sqlite" // registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/idemq/idemq/sqldb"
)

const nowTS = "strftime('%Y-%m-%d %H:%M:%f', 'now')"

// Dialect returns the SQLite dialect.
func Dialect() *sqldb.Dialect {
	return &sqldb.Dialect{
		Name:      sqldb.SQLite,
		QuoteChar: `"`,
		// ROUND: julianday is a float; truncation could lose a millisecond.
		NowMillis: `CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)`,
		Now:       nowTS,
		NowPlusMillis: func(ms string) string {
			return "strftime('%Y-%m-%d %H:%M:%f', 'now', (" + ms + " / 1000.0) || ' seconds')"
		},
		AgeSeconds: func(col string) string { return "((julianday('now') - julianday(" + col + ")) * 86400.0)" },
		// Unix milliseconds: an INTEGER column compares correctly whatever
		// the driver's time format.
		Time:         func(t time.Time) any { return t.UnixMilli() },
		DuplicateKey: IsDuplicateKey,
		Retryable:    retryable,
		Upsert:       sqldb.OnConflict,
		Returning:    true,
		RowID:        "rowid",
	}
}

// retryable reports SQLITE_BUSY and SQLITE_LOCKED (extended codes
// included). The busy timeout covers most lock waits, but SQLite returns
// BUSY at once, without calling the busy handler, where waiting could
// deadlock — for example when several connections to a new database switch
// it to WAL at the same moment, or a read transaction must upgrade to a
// write after another writer committed. The statement had no effect and
// may run again.
func retryable(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return true
	}
	return false
}

// IsDuplicateKey reports whether err is (or wraps) a *sqlite.Error with
// extended code SQLITE_CONSTRAINT_UNIQUE or SQLITE_CONSTRAINT_PRIMARYKEY.
func IsDuplicateKey(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	c := se.Code()
	return c == sqlite3.SQLITE_CONSTRAINT_UNIQUE || c == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
}

// DefaultBusyTimeout is the busy_timeout [DSN] sets.
const DefaultBusyTimeout = 30 * time.Second

// DSN returns a modernc.org/sqlite data source name for the database file
// at path with _txlock=immediate, busy_timeout (busy <= 0:
// [DefaultBusyTimeout]) and WAL. The path is escaped (any character
// may appear in it); a "file:" URI is taken as it is, the options
// appended.
func DSN(path string, busy time.Duration) string {
	if busy <= 0 {
		busy = DefaultBusyTimeout
	}
	q := url.Values{}
	q.Set("_txlock", "immediate")
	q.Add("_pragma", "busy_timeout("+strconv.FormatInt(busy.Milliseconds(), 10)+")")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	if strings.HasPrefix(path, "file:") {
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		return path + sep + q.Encode()
	}
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + q.Encode()
}

// Open opens the database file at path with [DSN]. The caller closes it.
func Open(path string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", DSN(path, 0))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	return db, nil
}

// Std adapts a database/sql pool opened with the "sqlite" driver (ideally
// by [Open]). The caller keeps owning db.
func Std(db *sql.DB) sqldb.Native[*sql.Tx] { return sqldb.Std(db, Dialect()) }
