package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/sqltest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/outbox"
)

// A claim reads about as many pending-index entries as it claims, also
// when the table's statistics are stale: a backlog committed since the
// last ANALYZE (a relay that was down, a burst) made the planner expect a
// few pending rows and read the whole backlog into a bitmap and sort it,
// for every claim of 256 rows. The pending index's idx_tup_read, read
// after the claiming pool is closed (its backends flush their counters
// when they exit), tells which plan ran.
func TestClaimDoesNotReadTheWholeBacklog(t *testing.T) {
	be := sqltest.PostgresStd()
	addr := be.NewDatabase(t)
	ctx := context.Background()
	admin, _ := be.Open(t, addr)
	if _, err := outbox.NewStore(ctx, admin, outbox.StoreConfig{}); err != nil {
		t.Fatal(err)
	}
	// No autovacuum: its ANALYZE would hide the case (it starts within a
	// minute of the inserts).
	if _, err := admin.Exec(ctx, `ALTER TABLE idemq_outbox SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	const backlog, batch = 20000, 256
	if _, err := admin.Exec(ctx, fmt.Sprintf(`INSERT INTO idemq_outbox (message_id, routing_key, body)
		SELECT 'm-' || g, 'q', '\x00'::bytea FROM generate_series(1, %d) g`, backlog)); err != nil {
		t.Fatal(err)
	}
	db, closeDB := be.Open(t, addr)
	claimer, err := outbox.NewStore(ctx, db, outbox.StoreConfig{NoMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		rows, err := claimer.Claim(ctx, "me", batch, time.Minute, false)
		if err != nil || len(rows) != batch {
			t.Fatalf("claim: %d rows, %v", len(rows), err)
		}
	}
	closeDB()
	var read int64
	testenv.Eventually(t, 30*time.Second, "the claims' index statistics", func() bool {
		err := admin.QueryRow(ctx, `SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes
			WHERE relname = 'idemq_outbox' AND indexrelname LIKE '%pending%'`).Scan(&read)
		if err != nil {
			t.Fatal(err)
		}
		return read > 0
	})
	// Three claims of 256: each walks past the rows claimed before it
	// (at most 512), so ~2300 entries; the whole backlog thrice is 60000.
	if read > 3*(3*batch)+1000 {
		t.Fatalf("the claims read %d pending-index entries for %d rows claimed from a backlog of %d: the whole backlog per claim", read, 3*batch, backlog)
	}
	t.Logf("3 claims of %d read %d pending-index entries", batch, read)
}

// A claim's UPDATE (owner, lease, attempts: no indexed column) is a
// heap-only tuple update: the new row version stays on its page and no
// index gets a new entry. With the default fillfactor the pages rows were
// inserted into were full, so every claim put each row's new version on
// another page and added an entry to the primary key and the pending
// index: about 40% of PostgreSQL's CPU per relayed row (docs/BENCHMARKS.md).
// The table keeps half of each page free (migration 3).
func TestClaimUpdatesStayOnTheirPage(t *testing.T) {
	be := sqltest.PostgresStd()
	addr := be.NewDatabase(t)
	ctx := context.Background()
	admin, _ := be.Open(t, addr)
	store, err := outbox.NewStore(ctx, admin, outbox.StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	const backlog, batch = 4000, 256
	body := make([]byte, 256)
	for i := 0; i < backlog; i += 500 {
		msgs := make([]outbox.Message, 0, 500)
		for j := i; j < i+500; j++ {
			msgs = append(msgs, outbox.Message{ID: fmt.Sprintf("m-%d", j), RoutingKey: "q", Body: body})
		}
		if err := store.Add(ctx, admin, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	db, closeDB := be.Open(t, addr)
	claimer, err := outbox.NewStore(ctx, db, outbox.StoreConfig{NoMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	claimed := 0
	for range 4 {
		rows, err := claimer.Claim(ctx, "me", batch, time.Minute, false)
		if err != nil || len(rows) != batch {
			t.Fatalf("claim: %d rows, %v", len(rows), err)
		}
		claimed += len(rows)
	}
	closeDB() // its backends flush their counters as they exit
	var upd, hot int64
	testenv.Eventually(t, 30*time.Second, "the claims' table statistics", func() bool {
		err := admin.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'idemq_outbox'`).Scan(&upd, &hot)
		if err != nil {
			t.Fatal(err)
		}
		return upd >= int64(claimed)
	})
	// A page holds ~20 of these rows: a claim of all of a half-full page's
	// rows may find no room for the last one or two.
	if hot < int64(claimed)*8/10 {
		t.Fatalf("%d of %d claimed rows were updated in place (HOT); want at least 80%%", hot, upd)
	}
	t.Logf("%d of %d claim updates were HOT", hot, upd)
}
