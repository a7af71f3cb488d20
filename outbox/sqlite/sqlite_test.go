package sqlite_test

import (
	"database/sql"
	"testing"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/outboxtest"
	"github.com/idemq/idemq/outbox/sqlite"
)

func open(t testing.TB, path, table string) (outbox.Store, *sql.DB) {
	s, err := sqlite.Open(path, sqlite.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, s.DB
}

var suite = outboxtest.Suite{NewDB: testenv.SQLitePath, Open: open, SingleRelay: true}

func TestConformance(t *testing.T)        { outboxtest.Run(t, suite) }
func TestHelperRelayProcess(t *testing.T) { outboxtest.HelperProcess(t, suite) }
