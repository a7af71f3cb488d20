package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup/sqlstore"
	"github.com/idemq/idemq/dedup/storetest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sqldb/postgres"
)

// The store's concurrent history through two crashes of its PostgreSQL
// (pg_ctl stop -m immediate: every connection cut, no shutdown checkpoint)
// and restarts: calls in flight fail (outcome unknown, the model allows
// both), calls during the outage fail, and what was committed stays. The
// history is linearizable.
func TestLinearizableThroughPostgresCrashes(t *testing.T) {
	pg := testenv.StartPrivatePostgres(t)
	url := pg.CreateDB("lincheck")
	ctx := context.Background()
	pool := testenv.PgxPool(t, url)
	st, err := sqlstore.New(ctx, postgres.Pgx(pool), sqlstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan storetest.LinResult, 1)
	until := make(chan struct{})
	go func() {
		done <- storetest.CheckLinearizable(t, st, "postgres-crashes", storetest.LinParams{Ops: 40, Pace: 2 * time.Millisecond, Until: until})
	}()
	for range 2 {
		time.Sleep(400 * time.Millisecond)
		pg.Stop()
		pg.Start()
	}
	time.Sleep(400 * time.Millisecond)
	close(until)
	res := <-done
	t.Logf("%d calls on %d keys, %d failed, 2 crashes + restarts: verdict %s", res.Ops, res.Keys, res.Errors, res.Verdict)
	if !res.Linearizable {
		t.Fatalf("through PostgreSQL crashes: verdict %s, want Ok; see %s", res.Verdict, res.Visualized)
	}
	if res.Errors == 0 {
		t.Fatal("no call failed: the crashes did not land among the calls")
	}
}
