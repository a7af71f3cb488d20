package postgres_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemq/idemq/inbox/inboxtest"
	"github.com/idemq/idemq/inbox/postgres"
	"github.com/idemq/idemq/internal/testenv"
)

const lockWaiters = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"

func pgxHarness() inboxtest.Harness[pgx.Tx] {
	return inboxtest.Harness[pgx.Tx]{
		Name:   "postgres-pgx",
		NewDSN: func(t testing.TB) string { return testenv.PostgresDB(t) },
		Open: func(t testing.TB, dsn string) inboxtest.DB[pgx.Tx] {
			pool, err := pgxpool.New(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			qi := func(ctx context.Context, q string, args ...any) (int64, error) {
				var n int64
				err := pool.QueryRow(ctx, q, args...).Scan(&n)
				return n, err
			}
			return inboxtest.DB[pgx.Tx]{
				Driver: postgres.Pgx(pool),
				Exec: func(ctx context.Context, q string, args ...any) error {
					_, err := pool.Exec(ctx, q, args...)
					return err
				},
				QueryInt: qi,
				LockWaiters: func(ctx context.Context) (int, error) {
					n, err := qi(ctx, lockWaiters)
					return int(n), err
				},
			}
		},
	}
}

func sqlHarness() inboxtest.Harness[*sql.Tx] {
	return inboxtest.Harness[*sql.Tx]{
		Name:   "postgres-stdlib",
		NewDSN: func(t testing.TB) string { return testenv.PostgresDB(t) },
		Open: func(t testing.TB, dsn string) inboxtest.DB[*sql.Tx] {
			db, err := sql.Open("pgx", dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return inboxtest.StdDB(postgres.SQL(db), db, lockWaiters)
		},
	}
}

func TestInboxPgx(t *testing.T)    { inboxtest.Run(t, pgxHarness()) }
func TestInboxStdlib(t *testing.T) { inboxtest.Run(t, sqlHarness()) }

// TestHelperInboxProcess is the child process of the kill tests; it skips
// itself unless started by one. IDEMQ_INBOXTEST_FLAVOR picks the harness.
func TestHelperInboxProcess(t *testing.T) {
	if inboxtest.Flavor() == "postgres-stdlib" {
		inboxtest.HelperProcess(t, sqlHarness())
		return
	}
	inboxtest.HelperProcess(t, pgxHarness())
}
