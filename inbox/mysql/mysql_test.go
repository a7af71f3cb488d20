package mysql_test

import (
	"database/sql"
	"testing"

	_ "github.com/go-sql-driver/mysql"

	"github.com/idemq/idemq/inbox/inboxtest"
	"github.com/idemq/idemq/inbox/mysql"
	"github.com/idemq/idemq/internal/testenv"
)

// No LockWaiters for MariaDB: querying information_schema.innodb_trx
// while a transaction waits on a row lock proved unreliable (it stalled
// until the lock wait ended), so the concurrent-duplicate tests check the
// outcome (second acked as a duplicate only after the first commits, run
// after a rollback) without observing the wait itself.

func harness() inboxtest.Harness[*sql.Tx] {
	return inboxtest.Harness[*sql.Tx]{
		Name:   "mysql",
		NewDSN: func(t testing.TB) string { return testenv.MySQLDB(t) },
		Open: func(t testing.TB, dsn string) inboxtest.DB[*sql.Tx] {
			db, err := sql.Open("mysql", dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return inboxtest.StdDB(mysql.Driver(db), db, "")
		},
	}
}

func TestInbox(t *testing.T) { inboxtest.Run(t, harness()) }

// TestHelperInboxProcess is the child process of the kill test.
func TestHelperInboxProcess(t *testing.T) { inboxtest.HelperProcess(t, harness()) }
