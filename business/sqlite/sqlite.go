// Package sqlite holds the business helpers' SQLite part: duplicate-key
// detection for modernc.org/sqlite errors. Use business.SQL for the
// Execer.
package sqlite

import (
	"errors"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

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
