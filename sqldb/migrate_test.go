package sqldb_test

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/idemq/idemq/dedup/sqlstore"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/sqltest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/sqldbtest"
)

// schemas are every table idemq owns, under their default names.
func schemas() []sqldb.Schema {
	return []sqldb.Schema{sqlstore.Schema(sqlstore.DefaultTable), inbox.Schema(inbox.DefaultTable), outbox.Schema(outbox.DefaultTable)}
}

// indexes are the index each schema's version 2 creates.
var indexes = []string{"idemq_dedup_expires_idx", "idemq_inbox_received_idx", "idemq_outbox_sent"}

func indexExists(t *testing.T, db sqldb.DB, name string) bool {
	t.Helper()
	var q string
	switch db.Dialect().Name {
	case sqldb.Postgres:
		q = "SELECT count(*) FROM pg_indexes WHERE indexname = $1"
	case sqldb.MySQL:
		q = "SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE() AND index_name = ?"
	default:
		q = "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = ?"
	}
	return sqldbtest.Int(t, db, q, name) > 0
}

// wantStatus checks every schema is at version min(upTo, its latest),
// the versions above it pending.
func wantStatus(t *testing.T, got []sqldb.SchemaStatus, upTo int) {
	t.Helper()
	latest := map[string]int{}
	for _, s := range schemas() {
		latest[s.Component] = len(s.Migrations)
	}
	for _, s := range got {
		var applied, pending []int
		for v := 1; v <= latest[s.Component]; v++ {
			if v <= upTo {
				applied = append(applied, v)
			} else {
				pending = append(pending, v)
			}
		}
		if !slices.Equal(s.Applied, applied) || !slices.Equal(s.Pending, pending) {
			t.Fatalf("%s %s: applied %v pending %v, want %v and %v", s.Component, s.Table, s.Applied, s.Pending, applied, pending)
		}
	}
}

// allVersions is how many migrations the schemas have in all: the rows
// of the version table once every one is applied.
func allVersions() int64 {
	var n int64
	for _, s := range schemas() {
		n += int64(len(s.Migrations))
	}
	return n
}

func testMigrations[T any](t *testing.T, b sqldbtest.Backend[T]) {
	t.Run("UpgradesAnOlderVersion", func(t *testing.T) {
		t.Parallel()
		db := b.Fresh(t)
		ctx := sqldbtest.Context(t)
		st, err := sqldb.Status(ctx, db, schemas()...)
		if err != nil {
			t.Fatal(err)
		}
		wantStatus(t, st, 0) // no version table yet
		// A database at version 1: the tables without their indexes.
		st, err = sqldb.Up(ctx, db, 1, schemas()...)
		if err != nil {
			t.Fatal(err)
		}
		wantStatus(t, st, 1)
		if st, err = sqldb.Status(ctx, db, schemas()...); err != nil {
			t.Fatal(err)
		}
		wantStatus(t, st, 1)
		for _, ix := range indexes {
			if indexExists(t, db, ix) {
				t.Fatalf("index %s exists at version 1", ix)
			}
		}
		st, err = sqldb.Up(ctx, db, 0, schemas()...)
		if err != nil {
			t.Fatal(err)
		}
		wantStatus(t, st, 99)
		for _, ix := range indexes {
			if !indexExists(t, db, ix) {
				t.Fatalf("index %s missing after up", ix)
			}
		}
		if n := sqldbtest.Int(t, db, "SELECT COUNT(*) FROM "+sqldb.VersionTable); n != allVersions() {
			t.Fatalf("%d rows in %s, want %d", n, sqldb.VersionTable, allVersions())
		}
	})
	t.Run("ConcurrentUpsDoNotCollide", func(t *testing.T) {
		t.Parallel()
		addr := b.NewDatabase(t)
		const n = 6
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			db, _ := b.Open(t, addr) // its own pool, as another process
			wg.Go(func() {
				<-start
				_, errs[i] = sqldb.Up(sqldbtest.Context(t), db, 0, schemas()...)
			})
		}
		close(start)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		db, _ := b.Open(t, addr)
		if n := sqldbtest.Int(t, db, "SELECT COUNT(*) FROM "+sqldb.VersionTable); n != allVersions() {
			t.Fatalf("%d rows in %s, want %d: a migration applied twice or not at all", n, sqldb.VersionTable, allVersions())
		}
	})
	t.Run("AdoptsTablesOfAnUnversionedRelease", func(t *testing.T) {
		t.Parallel()
		db := b.Fresh(t)
		ctx := sqldbtest.Context(t)
		// Tables and indexes created as releases before versioning did,
		// without the version table.
		for _, s := range schemas() {
			for _, m := range s.Migrations {
				for _, tmpl := range m.Up[db.Dialect().Name] {
					st, err := db.Dialect().Compile(tmpl, db.Dialect().TableVars(s.Table))
					if err != nil {
						t.Fatal(err)
					}
					sqldbtest.Exec(t, db, st.SQL)
				}
			}
		}
		st, err := sqldb.Up(ctx, db, 0, schemas()...)
		if err != nil {
			t.Fatalf("up over existing tables: %v", err)
		}
		wantStatus(t, st, 99)
	})
	t.Run("RefusesABadTable", func(t *testing.T) {
		t.Parallel()
		db := b.Fresh(t)
		_, err := sqldb.Up(sqldbtest.Context(t), db, 0, inbox.Schema("x;drop"))
		if !errors.Is(err, sqldb.ErrInvalidIdentifier) {
			t.Fatalf("Up = %v, want ErrInvalidIdentifier", err)
		}
	})
}

func TestMigrationsPostgres(t *testing.T) { t.Parallel(); testMigrations(t, sqltest.PostgresPgx()) }
func TestMigrationsMySQL(t *testing.T)    { t.Parallel(); testMigrations(t, sqltest.MySQL()) }
func TestMigrationsSQLite(t *testing.T)   { t.Parallel(); testMigrations(t, sqltest.SQLite()) }
