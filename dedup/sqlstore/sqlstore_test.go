package sqlstore_test

import (
	"testing"

	"github.com/idemq/idemq/dedup/sqlstore"
	"github.com/idemq/idemq/dedup/sqlstore/sqlstoretest"
	"github.com/idemq/idemq/internal/sqltest"
)

// Every backend runs the dedup conformance suite and the SQL cases.

func TestPostgresPgx(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, sqltest.PostgresPgx(), sqlstoretest.Features{Parallel: true})
}

func TestPostgresStdlib(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, sqltest.PostgresStd(), sqlstoretest.Features{Parallel: true})
}

func TestMySQL(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, sqltest.MySQL(), sqlstoretest.Features{Parallel: true})
}

func TestSQLite(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, sqltest.SQLite(), sqlstoretest.Features{Parallel: true})
}

func BenchmarkClaimCompletePostgres(b *testing.B) {
	be := sqltest.PostgresPgx()
	s, err := sqlstore.New(b.Context(), be.Fresh(b), sqlstore.Config{})
	if err != nil {
		b.Fatal(err)
	}
	sqlstoretest.BenchmarkClaimComplete(b, s)
}
