package postgres_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemq/idemq/dedup/sqlstore"
	"github.com/idemq/idemq/dedup/sqlstore/postgres"
	"github.com/idemq/idemq/dedup/sqlstore/sqlstoretest"
	"github.com/idemq/idemq/internal/testenv"
)

func openPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("pgxpool: %v", err)
	}
	return pool
}

func openDB(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatalf("sql.Open: %v", err)
	}
	return db
}

func newStore(t *testing.T, url string, cfg sqlstore.Config, native bool) (*sqlstore.Store, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if native {
		pool := openPool(t, url)
		s, err := postgres.New(ctx, pool, cfg)
		if err != nil {
			pool.Close()
			return nil, err
		}
		t.Cleanup(func() { s.Close(); pool.Close() })
		return s, nil
	}
	db := openDB(t, url)
	s, err := postgres.NewDB(ctx, db, cfg)
	if err != nil {
		db.Close()
		return nil, err
	}
	t.Cleanup(func() { s.Close(); db.Close() })
	return s, nil
}

func harness(native bool) sqlstoretest.Harness {
	return sqlstoretest.Harness{
		Database: func(t *testing.T) string { return testenv.PostgresDB(t) },
		Open: func(t *testing.T, url string, cfg sqlstore.Config) (*sqlstore.Store, error) {
			return newStore(t, url, cfg, native)
		},
		// A migrated store whose pool (or *sql.DB) is then closed.
		Broken: func(t *testing.T) *sqlstore.Store {
			url := testenv.PostgresDB(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if native {
				pool := openPool(t, url)
				s, err := postgres.New(ctx, pool, sqlstore.Config{})
				if err != nil {
					t.Fatalf("open: %v", err)
				}
				pool.Close()
				return s
			}
			db := openDB(t, url)
			s, err := postgres.NewDB(ctx, db, sqlstore.Config{})
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			db.Close()
			return s
		},
	}
}

// TestPgxPool runs the dedup conformance suite and the SQL cases on a
// *pgxpool.Pool, against the real PostgreSQL.
func TestPgxPool(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, harness(true))
}

// TestDatabaseSQL runs them on a *sql.DB through pgx/v5/stdlib.
func TestDatabaseSQL(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, harness(false))
}

func BenchmarkClaimCompletePool(b *testing.B) {
	url := testenv.PostgresDB(b)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	s, err := postgres.New(context.Background(), pool, sqlstore.Config{})
	if err != nil {
		b.Fatal(err)
	}
	sqlstoretest.BenchmarkClaimComplete(b, s)
}
