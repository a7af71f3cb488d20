package postgres_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemq/idemq/business"
	"github.com/idemq/idemq/business/businesstest"
	"github.com/idemq/idemq/business/postgres"
	"github.com/idemq/idemq/internal/testenv"
)

func TestPgx(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), testenv.PostgresDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	businesstest.Run(t, business.Postgres, postgres.Pgx(pool), postgres.IsDuplicateKey)
}

func TestStdlib(t *testing.T) {
	db, err := sql.Open("pgx", testenv.PostgresDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	businesstest.Run(t, business.Postgres, business.SQL(db), postgres.IsDuplicateKey)
}
