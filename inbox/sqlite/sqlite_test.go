package sqlite_test

import (
	"database/sql"
	"strings"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/idemq/idemq/inbox/inboxtest"
	"github.com/idemq/idemq/inbox/sqlite"
	"github.com/idemq/idemq/internal/testenv"
)

func harness() inboxtest.Harness[*sql.Tx] {
	return inboxtest.Harness[*sql.Tx]{
		Name:   "sqlite",
		NewDSN: func(t testing.TB) string { return testenv.SQLitePath(t) },
		Open: func(t testing.TB, path string) inboxtest.DB[*sql.Tx] {
			db, err := sql.Open("sqlite", sqlite.DSN(path, 0))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			// No lock-wait view in SQLite: a concurrent writer waits in
			// BEGIN IMMEDIATE (busy_timeout), which the suite cannot see.
			return inboxtest.StdDB(sqlite.Driver(db), db, "")
		},
	}
}

func TestInbox(t *testing.T) { inboxtest.Run(t, harness()) }

// TestHelperInboxProcess is the child process of the kill test.
func TestHelperInboxProcess(t *testing.T) { inboxtest.HelperProcess(t, harness()) }

func TestDSN(t *testing.T) {
	for _, tc := range []struct{ path, want string }{
		{"/tmp/x.db", "file:/tmp/x.db?_pragma=busy_timeout%2830000%29&_pragma=journal_mode%28WAL%29&_txlock=immediate"},
		{"/tmp/x.db?mode=rwc", "file:/tmp/x.db?mode=rwc&_pragma"},
	} {
		if got := sqlite.DSN(tc.path, 0); !strings.HasPrefix(got, tc.want) {
			t.Errorf("DSN(%q) = %q, want prefix %q", tc.path, got, tc.want)
		}
	}
}
