package inbox_test

import (
	"testing"

	"github.com/idemq/idemq/inbox/inboxtest"
	"github.com/idemq/idemq/internal/sqltest"
)

// Every backend runs the inbox suite (database only) and its end-to-end
// cases (with RabbitMQ), in parallel.

var features = inboxtest.Features{Parallel: true}

func TestPostgresPgx(t *testing.T) {
	t.Parallel()
	inboxtest.Run(t, sqltest.PostgresPgx(), features)
}

func TestPostgresStdlib(t *testing.T) {
	t.Parallel()
	inboxtest.Run(t, sqltest.PostgresStd(), features)
}

func TestMySQL(t *testing.T) {
	t.Parallel()
	inboxtest.Run(t, sqltest.MySQL(), features)
}

func TestSQLite(t *testing.T) {
	t.Parallel()
	inboxtest.Run(t, sqltest.SQLite(), features)
}

func TestBrokerPostgresPgx(t *testing.T) {
	t.Parallel()
	inboxtest.RunBroker(t, sqltest.PostgresPgx(), features)
}

func TestBrokerPostgresStdlib(t *testing.T) {
	t.Parallel()
	inboxtest.RunBroker(t, sqltest.PostgresStd(), features)
}

func TestBrokerMySQL(t *testing.T) {
	t.Parallel()
	inboxtest.RunBroker(t, sqltest.MySQL(), features)
}

func TestBrokerSQLite(t *testing.T) {
	t.Parallel()
	inboxtest.RunBroker(t, sqltest.SQLite(), features)
}

// TestHelperInboxProcess is the child process of the kill tests; it skips
// itself unless started by one. inboxtest.Flavor picks the backend.
func TestHelperInboxProcess(t *testing.T) {
	switch inboxtest.Flavor() {
	case "postgres-stdlib":
		inboxtest.HelperProcess(t, sqltest.PostgresStd())
	case "mysql":
		inboxtest.HelperProcess(t, sqltest.MySQL())
	case "sqlite":
		inboxtest.HelperProcess(t, sqltest.SQLite())
	default:
		inboxtest.HelperProcess(t, sqltest.PostgresPgx())
	}
}
