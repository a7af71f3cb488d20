package mysql_test

import (
	"database/sql"
	"testing"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/mysql"
	"github.com/idemq/idemq/outbox/outboxtest"
)

func open(t testing.TB, dsn, table string) (outbox.Store, *sql.DB) {
	s, err := mysql.Open(dsn, mysql.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, s.DB
}

var suite = outboxtest.Suite{NewDB: testenv.MySQLDB, Open: open}

func TestConformance(t *testing.T)        { outboxtest.Run(t, suite) }
func TestHelperRelayProcess(t *testing.T) { outboxtest.HelperProcess(t, suite) }
