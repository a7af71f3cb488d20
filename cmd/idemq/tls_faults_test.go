//go:build faults

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/redistest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb/dburl"
	"github.com/idemq/idemq/sqldb/postgres"
)

// unknownAuthority is what Go's TLS stack says of a server certificate
// signed by a CA the client does not trust.
const unknownAuthority = "x509: certificate signed by unknown authority"

// TestFaultTLS runs idemq as production does, over TLS everywhere, against
// private servers scripts/tls.sh starts with a throwaway CA: the consumer
// and the publisher on amqps://, the dedup guard on rediss://, the inbox and
// the outbox on PostgreSQL with sslmode=verify-full, the relay command, a
// keys command and the gate's Redis store with IDEMQ_AMQP_CA /
// IDEMQ_REDIS_CA. Then every client given the wrong CA is refused with an
// x509 "unknown authority" error — the library and the CLI alike — and none
// falls back to plain text (the PostgreSQL server accepts plain text too: a
// fallback would get in; RabbitMQ and Redis have no plain-text port).
func TestFaultTLS(t *testing.T) {
	srv := testenv.StartTLS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()

	// PostgreSQL, verify-full: the inbox's effects and the outbox.
	dsn := srv.PostgresURL("postgres", srv.CA)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var ssl bool
	if err := pool.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl); err != nil || !ssl {
		t.Fatalf("PostgreSQL session over TLS: ssl=%v err=%v", ssl, err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(ctx, postgres.Pgx(pool), inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}

	// Redis, rediss:// with the CA: the dedup guard's store.
	rdb := redis.NewClient(redisOpts(t, srv.RedisURL(), srv.CA))
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("rediss ping: %v", err)
	}
	const keyPrefix = "tls:"
	guard, err := dedup.NewGuard(dedup.Config{Store: redistest.Store(t, rdb, redisstore.Config{KeyPrefix: keyPrefix})})
	if err != nil {
		t.Fatal(err)
	}

	// The consumer and the publisher on amqps://.
	amqpsURL := srv.AMQPURL(srv.CA)
	queue := testenv.Name(t, "tls")
	declare := func(_ context.Context, ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(queue, true, false, false, false, nil)
		return err
	}
	var applied atomic.Int64
	h := ib.Handler(func(ctx context.Context, tx pgx.Tx, d *idemq.Delivery) error {
		if _, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, d.MessageID); err != nil {
			return err
		}
		applied.Add(1)
		return nil
	})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{URL: amqpsURL, Queue: queue, Setup: declare, Logger: quiet,
		Pipeline: idemq.Pipeline{Guard: guard, Handler: h}})
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(ctx)
	consumerDone := make(chan error, 1)
	go func() { consumerDone <- c.Run(cctx) }()
	defer func() {
		ccancel()
		select {
		case err := <-consumerDone:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("consumer: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("consumer did not stop within a minute")
		}
	}()
	p, err := idemq.NewPublisher(idemq.PublisherConfig{URL: amqpsURL, Setup: declare, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const n = 50
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("m-%d", i)
		if err := p.Publish(ctx, idemq.Message{ID: id, RoutingKey: queue, Body: []byte(id)}); err != nil {
			t.Fatalf("publish over amqps: %v", err)
		}
	}
	// A duplicate: the guard (over rediss) suppresses it.
	if err := p.Publish(ctx, idemq.Message{ID: "m-0", RoutingKey: queue, Body: []byte("m-0")}); err != nil {
		t.Fatal(err)
	}

	// The relay command: the outbox on PostgreSQL verify-full, the broker on
	// amqps:// with the CA from IDEMQ_AMQP_CA (the URL names none).
	t.Setenv(envAMQPCA, srv.CA)
	t.Setenv(envRedisCA, srv.CA)
	store, db := testStore(ctx, t, dburl.Target{Dialect: "postgres", DSN: dsn})
	for i := 0; i < 3; i++ {
		id := fmt.Sprintf("relay-%d", i)
		if err := store.Add(ctx, db, outbox.Message{ID: id, RoutingKey: queue, Body: []byte(id)}); err != nil {
			t.Fatal(err)
		}
	}
	plainAMQPS := fmt.Sprintf("amqps://guest:guest@localhost:%d/", srv.AMQPPort)
	relay := newRootCmd()
	var relayLog testenv.LogBuffer
	relay.SetOut(&relayLog)
	relay.SetErr(&relayLog)
	relay.SetArgs([]string{"relay", "--db", dsn, "--amqp", plainAMQPS, "--log-format", "text"})
	rctx, rcancel := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.ExecuteContext(rctx) }()

	countEffects := func() (rows, distinct int64) {
		_ = pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT id) FROM effects`).Scan(&rows, &distinct)
		return
	}
	testenv.Eventually(t, 90*time.Second, "the published and the relayed messages applied", func() bool {
		_, d := countEffects()
		return d >= n+3
	})
	rcancel()
	select {
	case err := <-relayDone:
		if err != nil {
			t.Fatalf("relay over TLS: %v\n%s", err, relayLog.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("relay command did not stop after its context was cancelled")
	}
	// The duplicate m-0 is acked by the guard, not applied.
	testenv.Eventually(t, 30*time.Second, "the queue drained", func() bool {
		conn, err := amqp.Dial(amqpsURL)
		if err != nil {
			return false
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return false
		}
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err == nil && q.Messages == 0
	})
	if rows, distinct := countEffects(); rows != n+3 || distinct != n+3 {
		t.Errorf("effects: %d rows, %d distinct, want %d", rows, distinct, n+3)
	}

	// A CLI command on rediss:// with IDEMQ_REDIS_CA: the guard's record.
	rediss := srv.RedisURL()
	out, err := runCLICtx(ctx, "keys", "get", "m-1", "--group", queue, "--redis-url", rediss, "--redis-key-prefix", keyPrefix)
	if err != nil || !strings.Contains(out, "m-1") || strings.Contains(out, "not found") {
		t.Fatalf("idemq keys get over rediss: %v\n%s", err, out)
	}
	// The gate's Redis store (idemq gate --store redis) with IDEMQ_REDIS_CA.
	gst, closeGate, err := gateStore(ctx, slog.Default(), gateFlags{store: "redis", redisURL: rediss, redisKeyPrefix: keyPrefix}, time.Hour)
	if err != nil || gst == nil {
		t.Fatalf("gate store over rediss: %v (store %v)", err, gst)
	}
	if _, err := gst.Claim(ctx, dedup.Key("idemq", queue, "gate-probe"), "t", time.Minute); err != nil {
		t.Fatalf("gate store over rediss: claim: %v", err)
	}
	closeGate()
	t.Logf("over TLS in %v: %d applied, relay and `idemq keys get` ok: %s", time.Since(start).Round(time.Millisecond), applied.Load(), strings.TrimSpace(out))

	// The wrong CA, everywhere: refused, with the x509 cause in the error.
	wrong := srv.WrongCA
	t.Run("AMQP", func(t *testing.T) {
		_, err := amqp.DialConfig(srv.AMQPURL(wrong), amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
		wantRefused(t, "amqp091-go dial", err)
		// The publisher's error, when its context ends while it retries.
		pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: srv.AMQPURL(wrong), Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		defer pcancel()
		err = pub.Publish(pctx, idemq.Message{ID: "never", RoutingKey: queue, Body: []byte("x")})
		wantRefused(t, "publisher", err)
		// The CLI, given the wrong CA in IDEMQ_AMQP_CA.
		t.Setenv(envAMQPCA, wrong)
		out, err := runCLICtx(ctx, "dlq", "list", queue, "--url", plainAMQPS)
		wantRefused(t, "idemq dlq list", err)
		if strings.Contains(out+fmt.Sprint(err), "guest:guest") {
			t.Errorf("password in the CLI's error: %v %s", err, out)
		}
		// No plain-text listener to fall back to.
		if conn, err := amqp.Dial(fmt.Sprintf("amqp://guest:guest@localhost:%d/", srv.AMQPPort)); err == nil {
			conn.Close()
			t.Error("a plain amqp:// connection to the TLS port succeeded")
		}
	})
	t.Run("Redis", func(t *testing.T) {
		bad := redis.NewClient(redisOpts(t, rediss, wrong))
		defer bad.Close()
		wantRefused(t, "go-redis ping", bad.Ping(ctx).Err())
		t.Setenv(envRedisCA, wrong)
		_, err := runCLICtx(ctx, "keys", "get", "m-1", "--group", queue, "--redis-url", rediss, "--redis-key-prefix", keyPrefix)
		wantRefused(t, "idemq keys get", err)
		gst, closeGate, err := gateStore(ctx, slog.Default(), gateFlags{store: "redis", redisURL: rediss, redisKeyPrefix: keyPrefix}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		_, err = gst.Claim(ctx, dedup.Key("idemq", queue, "gate-probe-2"), "t", time.Minute)
		closeGate()
		wantRefused(t, "idemq gate's Redis store", err)
		// No plain-text listener to fall back to.
		plain := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("localhost:%d", srv.RedisPort), MaxRetries: -1, DialTimeout: 5 * time.Second})
		defer plain.Close()
		if err := plain.Ping(ctx).Err(); err == nil {
			t.Error("a plain redis:// connection to the TLS port answered")
		}
	})
	t.Run("PostgreSQL", func(t *testing.T) {
		// The server takes plain text: a client falling back would get in.
		plain, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@localhost:%d/postgres?sslmode=disable", srv.PostgresPort))
		if err != nil {
			t.Fatalf("the server should accept plain text too (to show there is no fallback): %v", err)
		}
		_ = plain.Close(ctx)
		badDSN := srv.PostgresURL("postgres", wrong)
		_, err = pgx.Connect(ctx, badDSN)
		wantRefused(t, "pgx verify-full", err)
		pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
		defer pcancel()
		_, err = runCLICtx(pctx, "relay", "--db", badDSN, "--amqp", srv.AMQPURL(srv.CA), "--log-format", "text")
		wantRefused(t, "idemq relay", err)
	})
	t.Logf("TLS test done in %v", time.Since(start).Round(time.Millisecond))
}

// redisOpts is rawURL's go-redis options trusting the CA in caFile.
func redisOpts(t *testing.T, rawURL, caFile string) *redis.Options {
	t.Helper()
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("no certificate in %s", caFile)
	}
	if opt.TLSConfig == nil {
		t.Fatalf("%s: no TLS", rawURL)
	}
	opt.TLSConfig.RootCAs = pool
	opt.MaxRetries = -1
	return opt
}

// runCLICtx runs idemq with args in-process and returns its output.
func runCLICtx(ctx context.Context, args ...string) (string, error) {
	cmd := newRootCmd()
	var out testenv.LogBuffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

// wantRefused checks err is a refusal for an unknown CA.
func wantRefused(t *testing.T, who string, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s with the wrong CA: connected", who)
		return
	}
	var unknown x509.UnknownAuthorityError
	var verify *tls.CertificateVerificationError
	if !strings.Contains(err.Error(), unknownAuthority) {
		t.Errorf("%s with the wrong CA: error does not say %q: %v", who, unknownAuthority, err)
		return
	}
	t.Logf("%s with the wrong CA: refused: %v (errors.As UnknownAuthorityError %v, CertificateVerificationError %v)",
		who, err, errors.As(err, &unknown), errors.As(err, &verify))
}
