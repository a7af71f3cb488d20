package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/doctor"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/sqldb/postgres"
	"github.com/idemq/idemq/topology"
)

// The deployment this example sets up (make services: the queues of
// topology.yaml, the outbox and inbox tables migrated, the shared Redis
// as the guard's store, the guard's and the inbox's default windows) is
// what idemq doctor calls correct: every finding PASS.
func TestOrdersDeploymentPassesTheDoctor(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	mgmtURL := testenv.RequireManagement(t)
	ctx := context.Background()
	name := testenv.Name(t, "d") // ends in 8 random hex digits; table names stay short
	suffix := "_doc" + name[len(name)-8:]
	cfg := Config{AMQPURL: amqpURL, PostgresURL: testenv.PostgresURL(), RedisURL: testenv.RedisURL(),
		Suffix: suffix, Keep: true, Timeout: 150 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if _, err := Run(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	top, err := topology.Load(strings.NewReader(sampleTopology))
	if err != nil {
		t.Fatal(err)
	}
	for i := range top.Queues {
		top.Queues[i].Name += suffix
	}
	pool, err := pgxpool.New(ctx, cfg.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	opt, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	t.Cleanup(func() {
		cleanup(pool, rdb, top.Queues[0], "orders-example"+suffix, "orders"+sqlName(suffix), "invoices"+sqlName(suffix),
			"idemq_outbox"+sqlName(suffix), "idemq_inbox"+sqlName(suffix))
	})

	rep, err := doctor.Run(ctx, doctor.Config{
		Topology: top, AMQPURL: amqpURL, ManagementURL: mgmtURL,
		Redis: rdb, DB: postgres.Pgx(pool), InboxTable: "idemq_inbox" + sqlName(suffix), OutboxTable: "idemq_outbox" + sqlName(suffix),
		Retry:       retry.Config{},
		DedupWindow: 24 * time.Hour, InboxWindow: 7 * 24 * time.Hour, DeadLetterRetention: 12 * time.Hour,
		Timeout: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Findings {
		t.Logf("%s %s %s: %s", f.Status, f.Check, f.Subject, f.Detail)
		if f.Status != doctor.Pass {
			t.Errorf("%s %s: %s (%s; fix: %s)", f.Check, f.Subject, f.Status, f.Detail, f.Fix)
		}
	}
	if len(rep.Findings) < 10 {
		t.Errorf("%d findings: the doctor did not check the whole deployment", len(rep.Findings))
	}
}
