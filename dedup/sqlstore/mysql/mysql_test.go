package mysql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/idemq/idemq/dedup/sqlstore"
	"github.com/idemq/idemq/dedup/sqlstore/mysql"
	"github.com/idemq/idemq/dedup/sqlstore/sqlstoretest"
	"github.com/idemq/idemq/internal/testenv"
)

func open(t *testing.T, dsn string, cfg sqlstore.Config) (*sqlstore.Store, *sql.DB, error) {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatalf("sql.Open: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := mysql.New(ctx, db, cfg)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return s, db, nil
}

// TestStore runs the dedup conformance suite and the SQL cases against the
// real MariaDB.
func TestStore(t *testing.T) {
	sqlstoretest.Run(t, sqlstoretest.Harness{
		Database: func(t *testing.T) string { return testenv.MySQLDB(t) },
		Open: func(t *testing.T, dsn string, cfg sqlstore.Config) (*sqlstore.Store, error) {
			s, db, err := open(t, dsn, cfg)
			if err == nil {
				t.Cleanup(func() { s.Close(); db.Close() })
			}
			return s, err
		},
		Broken: func(t *testing.T) *sqlstore.Store {
			s, db, err := open(t, testenv.MySQLDB(t), sqlstore.Config{})
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			db.Close()
			return s
		},
	})
}

func BenchmarkClaimComplete(b *testing.B) {
	db, err := sql.Open("mysql", testenv.MySQLDB(b))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	s, err := mysql.New(context.Background(), db, sqlstore.Config{})
	if err != nil {
		b.Fatal(err)
	}
	sqlstoretest.BenchmarkClaimComplete(b, s)
}
