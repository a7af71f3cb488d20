// Package sqlite is the inbox's SQLite dialect over database/sql
// (modernc.org/sqlite): the handler receives a *sql.Tx. It imports no
// driver: blank-import modernc.org/sqlite yourself and open the database
// with [DSN].
//
// SQLite has one writer at a time. Open the database with [DSN] so that
//   - every transaction starts with BEGIN IMMEDIATE (_txlock=immediate): it
//     takes the write lock up front, so two deliveries of one ID serialize
//     at BEGIN — the second sees the first's committed row, or none if it
//     rolled back — and a deferred transaction never fails to upgrade its
//     read lock (SQLITE_BUSY mid-transaction);
//   - a writer waits for the lock instead of failing (busy_timeout);
//   - readers do not block the writer (journal_mode=WAL).
//
// Writes then serialize: throughput is one transaction at a time, so the
// batch inbox ([inbox.Inbox.Batch]) matters most here.
package sqlite

import (
	"context"
	"database/sql"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemq/idemq/inbox"
)

// DefaultBusyTimeout is the busy_timeout [DSN] sets.
const DefaultBusyTimeout = 30 * time.Second

// DSN returns a modernc.org/sqlite data source name for the file at path
// with _txlock=immediate, busy_timeout and WAL. busy <= 0 means
// [DefaultBusyTimeout].
func DSN(path string, busy time.Duration) string {
	if busy <= 0 {
		busy = DefaultBusyTimeout
	}
	q := url.Values{}
	q.Set("_txlock", "immediate")
	q.Add("_pragma", "busy_timeout("+strconv.FormatInt(busy.Milliseconds(), 10)+")")
	q.Add("_pragma", "journal_mode(WAL)")
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	return "file:" + path + sep + q.Encode()
}

// Driver returns the inbox driver for a SQLite database opened with [DSN].
func Driver(db *sql.DB) inbox.Driver[*sql.Tx] { return inbox.SQL(db, inbox.SQLite) }

// New creates (and migrates) an inbox on db.
func New(ctx context.Context, db *sql.DB, cfg inbox.Config) (*inbox.Inbox[*sql.Tx], error) {
	return inbox.New(ctx, Driver(db), cfg)
}
