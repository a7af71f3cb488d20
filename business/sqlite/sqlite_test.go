package sqlite_test

import (
	"database/sql"
	"testing"

	"github.com/idemq/idemq/business"
	"github.com/idemq/idemq/business/businesstest"
	"github.com/idemq/idemq/business/sqlite"
	"github.com/idemq/idemq/internal/testenv"
)

func TestSQLite(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+testenv.SQLitePath(t)+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	businesstest.Run(t, business.SQLite, business.SQL(db), sqlite.IsDuplicateKey)
}
