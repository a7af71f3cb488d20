package sqlite_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup/sqlstore"
	"github.com/idemq/idemq/dedup/sqlstore/sqlite"
	"github.com/idemq/idemq/dedup/sqlstore/sqlstoretest"
	"github.com/idemq/idemq/internal/testenv"
)

// harness opens each store's *sql.DB with open(path).
func harness(open func(path string) (*sql.DB, error)) sqlstoretest.Harness {
	newStore := func(t *testing.T, path string, cfg sqlstore.Config) (*sqlstore.Store, *sql.DB, error) {
		t.Helper()
		db, err := open(path)
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s, err := sqlite.New(ctx, db, cfg)
		if err != nil {
			db.Close()
			return nil, nil, err
		}
		return s, db, nil
	}
	return sqlstoretest.Harness{
		Database: func(t *testing.T) string { return testenv.SQLitePath(t) },
		Open: func(t *testing.T, path string, cfg sqlstore.Config) (*sqlstore.Store, error) {
			s, db, err := newStore(t, path, cfg)
			if err == nil {
				t.Cleanup(func() { s.Close(); db.Close() })
			}
			return s, err
		},
		Broken: func(t *testing.T) *sqlstore.Store {
			s, db, err := newStore(t, testenv.SQLitePath(t), sqlstore.Config{})
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			db.Close()
			return s
		},
	}
}

// TestStore runs the dedup conformance suite and the SQL cases on databases
// opened by sqlite.OpenDB (one connection, busy timeout, WAL).
func TestStore(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, harness(sqlite.OpenDB))
}

// TestStoreManyConnections runs them with a connection pool (no
// SetMaxOpenConns(1)): the busy timeout alone must keep 50 concurrent
// claimers free of SQLITE_BUSY, as it must for several processes.
func TestStoreManyConnections(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, harness(func(path string) (*sql.DB, error) {
		return sql.Open("sqlite", sqlite.DSN(path))
	}))
}

// TestDSNEscapesPath: a path with characters that mean something in a URI
// still opens the intended file.
func TestDSNEscapesPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a dir?#%")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "dedup.sqlite")
	db, err := sqlite.OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := sqlite.New(ctx, db, sqlstore.Config{})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer s.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("database file not at %s: %v", path, err)
	}
}

func BenchmarkClaimComplete(b *testing.B) {
	db, err := sqlite.OpenDB(testenv.SQLitePath(b))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	s, err := sqlite.New(context.Background(), db, sqlstore.Config{})
	if err != nil {
		b.Fatal(err)
	}
	sqlstoretest.BenchmarkClaimComplete(b, s)
}
