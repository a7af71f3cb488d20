package doctor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/doctor"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/postgres"
	"github.com/idemq/idemq/topology"
)

// find returns the findings of check (on subject, when not empty).
func find(r doctor.Report, check, subject string) []doctor.Finding {
	var out []doctor.Finding
	for _, f := range r.Findings {
		if f.Check == check && (subject == "" || f.Subject == subject) {
			out = append(out, f)
		}
	}
	return out
}

func requireOne(t *testing.T, r doctor.Report, check, subject string, want doctor.Status) doctor.Finding {
	t.Helper()
	fs := find(r, check, subject)
	if len(fs) != 1 {
		t.Fatalf("%s %s: %d findings, want 1:\n%s", check, subject, len(fs), show(r))
	}
	if fs[0].Status != want {
		t.Fatalf("%s %s: %s (%s), want %s:\n%s", check, subject, fs[0].Status, fs[0].Detail, want, show(r))
	}
	if want != doctor.Pass && (fs[0].Meaning == "" || fs[0].Fix == "") {
		t.Fatalf("%s %s: %s without its meaning or fix: %+v", check, subject, want, fs[0])
	}
	return fs[0]
}

func show(r doctor.Report) string {
	var b strings.Builder
	for _, f := range r.Findings {
		fmt.Fprintf(&b, "  %s %s %s: %s\n", f.Status, f.Check, f.Subject, f.Detail)
	}
	return b.String()
}

func run(t *testing.T, cfg doctor.Config) doctor.Report {
	t.Helper()
	r, err := doctor.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The windows against the retry horizon: no service needed.
func TestHorizons(t *testing.T) {
	top := topology.Topology{Queues: []topology.Queue{
		{Name: "a", RetryDelays: []time.Duration{time.Second, time.Minute}},
		{Name: "b", RetryDelays: []time.Duration{time.Minute, time.Hour}}, // horizon 1h1m + quick retries
	}}
	for _, tc := range []struct {
		name             string
		window, retained time.Duration
		want             doctor.Status
	}{
		{"shorter than the horizon", 30 * time.Minute, 0, doctor.Fail},
		{"horizon covered, retention not", 2 * time.Hour, 2 * time.Hour, doctor.Fail},
		{"retention not given", 2 * time.Hour, 0, doctor.Warn},
		{"both covered", 24 * time.Hour, 7 * time.Hour, doctor.Pass},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, doctor.Config{Topology: top, DedupWindow: tc.window, InboxWindow: tc.window, DeadLetterRetention: tc.retained})
			f := requireOne(t, r, "horizon.dedup-window", "", tc.want)
			requireOne(t, r, "horizon.inbox-window", "", tc.want)
			if tc.want == doctor.Fail && !strings.Contains(f.Detail, "(b)") && !strings.Contains(f.Detail, "dead-letter retention") {
				t.Errorf("the finding does not name the queue with the longest horizon: %s", f.Detail)
			}
		})
	}
}

// A classic retry queue on the dead-letter route behind a quorum work
// queue is a FAIL of the topology itself; the same on quorum retry queues
// a WARN (late, not lost); the release route a PASS.
func TestRetryRoute(t *testing.T) {
	top := topology.Topology{Queues: []topology.Queue{
		{Name: "lossy", Type: topology.Quorum, RetryType: topology.Classic, RetryRoute: topology.RouteDeadLetter},
		{Name: "late", Type: topology.Quorum, RetryRoute: topology.RouteDeadLetter},
		{Name: "released", Type: topology.Quorum},
	}}
	r := run(t, doctor.Config{Topology: top})
	requireOne(t, r, "topology.retry-route", "queue lossy", doctor.Fail)
	requireOne(t, r, "topology.retry-route", "queue late", doctor.Warn)
	requireOne(t, r, "topology.retry-route", "queue released", doctor.Pass)
}

// Redis: allkeys-lru with a memory limit FAILs, noeviction PASSes;
// persistence FAILs without it when the guard is the only line.
func TestRedisSettings(t *testing.T) {
	ctx := context.Background()
	rs := testenv.StartPrivateRedis(t, true)
	c := rs.Client()
	defer c.Close()
	set := func(k, v string) {
		if err := c.ConfigSet(ctx, k, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	set("maxmemory", "64mb")
	set("maxmemory-policy", "allkeys-lru")
	r := run(t, doctor.Config{Redis: c, RedisOnlyLine: true})
	requireOne(t, r, "redis.maxmemory-policy", "", doctor.Fail)
	requireOne(t, r, "redis.persistence", "", doctor.Pass) // appendonly yes, appendfsync always
	requireOne(t, r, "redis.replication", "", doctor.Pass)

	set("maxmemory-policy", "volatile-ttl") // done records carry a TTL
	requireOne(t, run(t, doctor.Config{Redis: c}), "redis.maxmemory-policy", "", doctor.Fail)

	set("maxmemory-policy", "noeviction")
	set("appendonly", "no")
	requireOne(t, run(t, doctor.Config{Redis: c}), "redis.maxmemory-policy", "", doctor.Pass)
	requireOne(t, run(t, doctor.Config{Redis: c}), "redis.persistence", "", doctor.Pass) // the inbox is the last line
	requireOne(t, run(t, doctor.Config{Redis: c, RedisOnlyLine: true}), "redis.persistence", "", doctor.Fail)

	rs.Stop()
	requireOne(t, run(t, doctor.Config{Redis: c, Timeout: 3 * time.Second}), "redis.reach", "", doctor.Fail)
}

// The broker: a work queue declared without its DLQ and retry queues
// FAILs for each missing one; the queue itself PASSes with the arguments
// the topology plans; a queue declared with other arguments FAILs; a
// policy that expires messages FAILs.
func TestBrokerQueues(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	mgmtURL := testenv.RequireManagement(t)
	name := testenv.Name(t, "doctor")
	q := topology.Queue{Name: name, Type: topology.Quorum, RetryDelays: []time.Duration{time.Second}}
	top := topology.Topology{Queues: []topology.Queue{q}}
	p := topology.ForQueue(q)
	t.Cleanup(func() { testenv.DeleteQueue(p.Queue, p.DLQ, p.Retries[0].Name) })

	ch := testenv.Channel(t)
	if _, err := ch.QueueDeclare(p.Queue, true, false, false, false, p.Args); err != nil {
		t.Fatal(err)
	}
	// The management API reports a queue's policies only after its next
	// statistics collection: on a busy machine that can take longer than
	// the default 10 s, so the runs here may wait a minute.
	cfg := doctor.Config{Topology: top, AMQPURL: amqpURL, ManagementURL: mgmtURL, Timeout: time.Minute}
	r := run(t, cfg)
	requireOne(t, r, "broker.queue", p.Queue, doctor.Pass)
	requireOne(t, r, "broker.dlq", p.DLQ, doctor.Fail)
	requireOne(t, r, "broker.retry-queue", p.Retries[0].Name, doctor.Fail)
	requireOne(t, r, "broker.delivery-limit", p.Queue, doctor.Pass)

	// Declared as the topology says: every broker check passes.
	if err := topology.Declare(context.Background(), ch, top); err != nil {
		t.Fatal(err)
	}
	r = run(t, cfg)
	for _, f := range r.Findings {
		if strings.HasPrefix(f.Check, "broker.") && f.Status != doctor.Pass {
			t.Errorf("declared as planned, yet %s %s: %s %s", f.Check, f.Subject, f.Status, f.Detail)
		}
	}

	// The retry queue as an earlier idemq declared it (TTL and a
	// dead-letter route back): a FAIL that names the upgrade.
	testenv.DeleteQueue(p.Retries[0].Name)
	old := topology.RetryArgs(topology.RouteDeadLetter, topology.Quorum, p.Queue, time.Second)
	if _, err := ch.QueueDeclare(p.Retries[0].Name, true, false, false, false, old); err != nil {
		t.Fatal(err)
	}
	f := requireOne(t, run(t, cfg), "broker.retry-queue", p.Retries[0].Name, doctor.Fail)
	if !strings.Contains(f.Fix, "retry_route: dead-letter") {
		t.Errorf("fix %q does not name the upgrade", f.Fix)
	}

	// A policy that expires the work queue's messages.
	testenv.SetPolicy(t, false, name+"-ttl", "^"+p.Queue+"$", `{"message-ttl":60000}`, 50)
	testenv.Eventually(t, 30*time.Second, "the doctor to see the policy", func() bool {
		for _, f := range find(run(t, cfg), "broker.policy", p.Queue) {
			if f.Status == doctor.Fail && strings.Contains(f.Detail, "message-ttl") {
				return true
			}
		}
		return false
	})
}

// Without the management API only existence is checked, and that says so.
func TestBrokerWithoutManagement(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	name := testenv.Name(t, "doctor")
	top := topology.Topology{Queues: []topology.Queue{{Name: name, NoRetry: true, DLQ: "-"}}}
	t.Cleanup(func() { testenv.DeleteQueue(name) })
	if _, err := testenv.Channel(t).QueueDeclare(name, true, false, false, false, amqp.Table{}); err != nil {
		t.Fatal(err)
	}
	r := run(t, doctor.Config{Topology: top, AMQPURL: amqpURL})
	requireOne(t, r, "broker.management", "", doctor.Warn)
	requireOne(t, r, "broker.queue", name, doctor.Pass)
	requireOne(t, run(t, doctor.Config{Topology: top, AMQPURL: "amqp://guest:guest@127.0.0.1:1/", Timeout: 3 * time.Second}),
		"broker.reach", "", doctor.Fail)
}

// SQL: migrations pending FAIL, applied PASS; the outbox's lag and failed
// rows.
func TestSQL(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	db := postgres.Pgx(pool)
	cfg := doctor.Config{DB: db, InboxTable: "doc_inbox", OutboxTable: "doc_outbox"}
	r := run(t, cfg)
	requireOne(t, r, "sql.migrations", "inbox doc_inbox", doctor.Fail)
	requireOne(t, r, "sql.migrations", "outbox doc_outbox", doctor.Fail)
	if _, err := sqldb.Up(ctx, db, 0, inbox.Schema("doc_inbox"), outbox.Schema("doc_outbox")); err != nil {
		t.Fatal(err)
	}
	r = run(t, cfg)
	requireOne(t, r, "sql.migrations", "inbox doc_inbox", doctor.Pass)
	requireOne(t, r, "sql.migrations", "outbox doc_outbox", doctor.Pass)
	requireOne(t, r, "sql.outbox-lag", "", doctor.Pass)
	requireOne(t, r, "sql.outbox-failed", "", doctor.Pass)

	// A row pending for two hours, one failed.
	st, err := outbox.NewStore(ctx, db, outbox.StoreConfig{Table: "doc_outbox", NoMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin(ctx, sqldb.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Add(ctx, tx, outbox.Message{ID: "doc-1", RoutingKey: "q", Body: []byte("x")},
		outbox.Message{ID: "doc-2", RoutingKey: "q", Body: []byte("y")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE doc_outbox SET created_at = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE doc_outbox SET state = 'failed' WHERE message_id = 'doc-2'`); err != nil {
		t.Fatal(err)
	}
	r = run(t, cfg)
	requireOne(t, r, "sql.outbox-lag", "", doctor.Fail)
	requireOne(t, r, "sql.outbox-failed", "", doctor.Warn)
}

// A Redis Cluster: CLUSTER INFO ok with every slot, and each primary's
// own settings checked.
func TestRedisCluster(t *testing.T) {
	rc := testenv.StartRedisCluster(t, 3)
	r := run(t, doctor.Config{Redis: rc.Client()})
	requireOne(t, r, "redis.cluster", "", doctor.Pass)
	if n := len(find(r, "redis.maxmemory-policy", "")); n != 6 {
		t.Fatalf("%d nodes' eviction policies checked, want 6 (primaries and replicas):\n%s", n, show(r))
	}
	primaries := 0
	for _, f := range find(r, "redis.replication", "") {
		if f.Status != doctor.Pass {
			t.Errorf("replication of %s: %s %s", f.Subject, f.Status, f.Detail)
		}
		if strings.Contains(f.Detail, "1 replica(s)") {
			primaries++
		}
	}
	if primaries != 3 {
		t.Errorf("%d primaries with their replica in sync, want 3:\n%s", primaries, show(r))
	}
}
