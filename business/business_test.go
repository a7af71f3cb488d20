package business_test

import (
	"testing"

	"github.com/idemq/idemq/business"
	"github.com/idemq/idemq/business/businesstest"
	"github.com/idemq/idemq/internal/sqltest"
)

func TestTransitionErrorMessage(t *testing.T) {
	e := &business.TransitionError{Table: "orders", ID: 7, From: "new", To: "paid", Current: "cancelled"}
	if got, want := e.Error(), `business: orders 7: cannot go from "new" to "paid": it is "cancelled"`; got != want {
		t.Fatalf("%s, want %s", got, want)
	}
}

// Every backend runs the business suite.

var features = businesstest.Features{Parallel: true}

func TestPostgresPgx(t *testing.T) {
	t.Parallel()
	businesstest.Run(t, sqltest.PostgresPgx(), features)
}

func TestPostgresStdlib(t *testing.T) {
	t.Parallel()
	businesstest.Run(t, sqltest.PostgresStd(), features)
}

func TestMySQL(t *testing.T) {
	t.Parallel()
	businesstest.Run(t, sqltest.MySQL(), features)
}

func TestSQLite(t *testing.T) {
	t.Parallel()
	businesstest.Run(t, sqltest.SQLite(), features)
}
