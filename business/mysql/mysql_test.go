package mysql_test

import (
	"database/sql"
	"testing"

	_ "github.com/go-sql-driver/mysql"

	"github.com/idemq/idemq/business"
	"github.com/idemq/idemq/business/businesstest"
	"github.com/idemq/idemq/business/mysql"
	"github.com/idemq/idemq/internal/testenv"
)

func TestMySQL(t *testing.T) {
	db, err := sql.Open("mysql", testenv.MySQLDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	businesstest.Run(t, business.MySQL, business.SQL(db), mysql.IsDuplicateKey)
}
