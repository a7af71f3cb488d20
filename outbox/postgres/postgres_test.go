package postgres_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/outboxtest"
	"github.com/idemq/idemq/outbox/postgres"
)

func open(t testing.TB, dsn, table string) (outbox.Store, *sql.DB) {
	s, err := postgres.Open(dsn, postgres.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, s.DB
}

var suite = outboxtest.Suite{NewDB: testenv.PostgresDB, Open: open}

func TestConformance(t *testing.T)        { outboxtest.Run(t, suite) }
func TestHelperRelayProcess(t *testing.T) { outboxtest.HelperProcess(t, suite) }

// TestPgxTxAndNotify adds through a pgx.Tx (rollback and commit) and checks
// that LISTEN/NOTIFY wakes a relay whose polling fallback is a minute away.
func TestPgxTxAndNotify(t *testing.T) {
	testenv.RequireAMQP(t)
	dsn := testenv.PostgresDB(t)
	store, _ := open(t, dsn, "app_outbox")
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	q := testenv.Queue(t, nil)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())

	add := func(id string, commit bool) {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Add(ctx, postgres.Tx(tx), outbox.Message{ID: id, RoutingKey: q, Body: []byte(id)}); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}

	pub := idemq.NewPublisher(idemq.PublisherConfig{})
	defer pub.Close()
	r := outbox.NewRelay(outbox.RelayConfig{Store: store, Publisher: pub,
		PollInterval: time.Minute, MaxPollInterval: time.Minute})
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() { rcancel(); <-done }()

	// The relay's first claim (and the listener's wake after connect)
	// happen at start; afterwards only a notification can wake it within
	// the minute.
	var got []string
	testenv.Eventually(t, 30*time.Second, "relay idle", func() bool {
		st, err := store.Stats(ctx)
		return err == nil && st.Pending == 0
	})
	add("pgx-rolled-back", false)
	add("pgx-committed", true)
	testenv.Eventually(t, 20*time.Second, "committed pgx message published through NOTIFY", func() bool {
		for _, d := range testenv.Drain(t, q) {
			got = append(got, d.MessageId)
		}
		return len(got) > 0
	})
	if len(got) != 1 || got[0] != "pgx-committed" {
		t.Fatalf("consumed %v, want only pgx-committed", got)
	}
}
