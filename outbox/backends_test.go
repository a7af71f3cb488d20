package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/sqltest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/outboxtest"
	"github.com/idemq/idemq/sqldb/postgres"
)

// Every backend runs the store suite (database only, in parallel) and the
// relay suite (with RabbitMQ).

var storeFeatures = outboxtest.Features{Parallel: true}

func TestStorePostgresPgx(t *testing.T) {
	t.Parallel()
	outboxtest.Run(t, sqltest.PostgresPgx(), storeFeatures)
}

func TestStorePostgresStdlib(t *testing.T) {
	t.Parallel()
	outboxtest.Run(t, sqltest.PostgresStd(), storeFeatures)
}

func TestStoreMySQL(t *testing.T) {
	t.Parallel()
	outboxtest.Run(t, sqltest.MySQL(), storeFeatures)
}

func TestStoreSQLite(t *testing.T) {
	t.Parallel()
	outboxtest.Run(t, sqltest.SQLite(), outboxtest.Features{SingleRelay: true, Parallel: true})
}

func TestRelayPostgresPgx(t *testing.T) {
	outboxtest.RunRelay(t, sqltest.PostgresPgx(), outboxtest.Features{})
}

func TestRelayPostgresStdlib(t *testing.T) {
	outboxtest.RunRelay(t, sqltest.PostgresStd(), outboxtest.Features{})
}

func TestRelayMySQL(t *testing.T) {
	outboxtest.RunRelay(t, sqltest.MySQL(), outboxtest.Features{})
}

func TestRelaySQLite(t *testing.T) {
	outboxtest.RunRelay(t, sqltest.SQLite(), outboxtest.Features{SingleRelay: true})
}

// TestHelperRelayProcess is the child of the crash cases; outboxtest.Flavor
// picks the backend.
func TestHelperRelayProcess(t *testing.T) {
	switch outboxtest.Flavor() {
	case "postgres-stdlib":
		outboxtest.HelperProcess(t, sqltest.PostgresStd())
	case "mysql":
		outboxtest.HelperProcess(t, sqltest.MySQL())
	case "sqlite":
		outboxtest.HelperProcess(t, sqltest.SQLite())
	default:
		outboxtest.HelperProcess(t, sqltest.PostgresPgx())
	}
}

// TestPgxTxAndNotify adds through a pgx.Tx (rollback and commit) and checks
// that LISTEN/NOTIFY wakes a relay whose polling fallback is a minute away.
func TestPgxTxAndNotify(t *testing.T) {
	testenv.RequireAMQP(t)
	be := sqltest.PostgresPgx()
	dsn := be.NewDatabase(t)
	db, _ := be.Open(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	store, err := outbox.NewStore(ctx, db, outbox.StoreConfig{Table: "app_outbox", Listen: postgres.Listener(dsn)})
	if err != nil {
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
		if err := store.Add(ctx, postgres.PgxTx(tx), outbox.Message{ID: id, RoutingKey: q, Body: []byte(id)}); err != nil {
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

	pub, err := idemq.NewPublisher(idemq.PublisherConfig{Dial: testenv.Dial})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	r, err := outbox.NewRelay(outbox.RelayConfig{Store: store, Publisher: pub,
		PollInterval: time.Minute, MaxPollInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
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
