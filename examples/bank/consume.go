package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/metrics"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/sqldb/postgres"
	"github.com/idemq/idemq/topology"
)

// Crash hooks for the fault suite: IDEMQ_BANK_CRASH=<point>[,<point>…] and
// IDEMQ_BANK_CRASH_RATE=<probability per delivery> make the process SIGKILL
// itself at that point, so every window is hit on purpose, not by chance.
const (
	crashBeforeClaim = "before-claim" // delivery received, nothing done yet
	crashInHandler   = "in-handler"   // effect written, transaction not committed
	crashAfterCommit = "after-commit" // effect committed; dedup record not completed / not acked
	crashBeforeAck   = "before-ack"   // everything done, the ack not sent
)

type consumeOpts struct {
	amqpURL, pgURL, redisURL string
	// cluster: the nodes' URLs (comma-separated) and the Redis Sentinels
	// (comma-separated host:port) with the primary's name.
	amqpURLs, sentinels, master string
	// redisCluster: a Redis Cluster's seed nodes (comma-separated
	// host:port); replaces --redis and --redis-sentinels.
	redisCluster           string
	mode, queue, queueType string
	workers, prefetch      int
	lease                  time.Duration
	stats                  string
	// metricsAddr serves /metrics, /healthz and /readyz (empty: off).
	metricsAddr string
	crash       map[string]bool
	crashRate   float64
	// failRate is the fraction of transfers failing transiently on their
	// first one or two attempts (transient.go).
	failRate float64
	// freeze is the demo's freeze hook (IDEMQ_BANK_FREEZE=1); nil otherwise.
	freeze *freezeArm
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func consumeMain(args []string) error {
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	var o consumeOpts
	fs.StringVar(&o.amqpURL, "amqp", envOr("IDEMQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "AMQP URL")
	fs.StringVar(&o.pgURL, "postgres", envOr("IDEMQ_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "PostgreSQL URL")
	fs.StringVar(&o.redisURL, "redis", envOr("IDEMQ_REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis URL")
	fs.StringVar(&o.amqpURLs, "amqp-urls", "", "comma-separated AMQP URLs of a cluster's nodes (replaces --amqp)")
	fs.StringVar(&o.sentinels, "redis-sentinels", "", "comma-separated Redis Sentinel addresses (replaces --redis)")
	fs.StringVar(&o.master, "redis-master", "idemq", "the primary's name the Sentinels monitor")
	fs.StringVar(&o.redisCluster, "redis-cluster", "", "comma-separated Redis Cluster seed nodes (replaces --redis and --redis-sentinels)")
	fs.StringVar(&o.mode, "mode", "inbox", "none | dedup | inbox")
	fs.StringVar(&o.queue, "queue", "bank.transfers", "queue name")
	fs.StringVar(&o.queueType, "queue-type", "quorum", "quorum | classic")
	fs.IntVar(&o.workers, "workers", 4, "handler goroutines")
	fs.IntVar(&o.prefetch, "prefetch", 100, "prefetch (QoS)")
	fs.DurationVar(&o.lease, "lease", 5*time.Second, "dedup lease (dedup mode)")
	fs.StringVar(&o.stats, "stats", "", "write counters as JSON to this file every 25ms and at exit")
	fs.Float64Var(&o.failRate, "fail-rate", 0, "fraction of transfers whose handler fails with an ordinary (transient) error on their first one or two attempts, chosen by a hash of the message ID (the demo's fault)")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "serve /metrics, /healthz and /readyz on this address (host:port; empty: off)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch o.mode {
	case "none", "dedup", "inbox":
	default:
		return fmt.Errorf("--mode %q: want none, dedup or inbox", o.mode)
	}
	if o.queueType != "quorum" && o.queueType != "classic" {
		return fmt.Errorf("--queue-type %q: want quorum or classic", o.queueType)
	}
	if o.failRate < 0 || o.failRate > 1 {
		return fmt.Errorf("--fail-rate %g: want a fraction in [0, 1]", o.failRate)
	}
	o.crash = map[string]bool{}
	for _, p := range bytes.Split([]byte(os.Getenv("IDEMQ_BANK_CRASH")), []byte(",")) {
		if len(p) > 0 {
			o.crash[string(p)] = true
		}
	}
	if r := os.Getenv("IDEMQ_BANK_CRASH_RATE"); r != "" {
		v, err := strconv.ParseFloat(r, 64)
		if err != nil {
			return fmt.Errorf("IDEMQ_BANK_CRASH_RATE: %w", err)
		}
		o.crashRate = v
	}
	if os.Getenv("IDEMQ_BANK_FREEZE") == "1" {
		o.freeze = newFreezeArm()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return consume(ctx, o)
}

// Topology of the bank: the work queue, its dead-letter queue and two retry
// delays. Shared by every `bank consume` and by the demo's publisher.
//
// The delivery limit is raised from the default 20 to bankDeliveryLimit:
// the demo kills its consumers at a rate no production sees (at
// --crash-rate 0.005, one delivery in fifty), and every kill counts one
// delivery for each message in the killed consumer's prefetch, run or
// not. The given-back block goes back to the head of the queue together,
// so a few dozen transfers can be counted 20 times in one run without
// their handler ever failing (measured: at a limit of 6, 19 consecutive
// transfers dead-lettered in one run of 20 kills; in CI, at 20, 15 in a
// run of 31 kills). The demo measures exactly-once, not the backstop.
func bankQueue(name, typ string) topology.Queue {
	q := topology.Queue{
		Name:        name,
		Type:        topology.QueueType(typ),
		RetryDelays: []time.Duration{200 * time.Millisecond, time.Second},
	}
	if q.Type == topology.Quorum {
		q.DeliveryLimit = bankDeliveryLimit
	}
	return q
}

// bankDeliveryLimit is the bank queue's x-delivery-limit (see bankQueue).
const bankDeliveryLimit = 100

const schema = `
CREATE TABLE IF NOT EXISTS accounts (id text PRIMARY KEY, balance bigint NOT NULL);
CREATE TABLE IF NOT EXISTS bank_applied (message_id text NOT NULL, mode text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());
ALTER TABLE bank_applied ADD COLUMN IF NOT EXISTS attempt int NOT NULL DEFAULT 1;
CREATE INDEX IF NOT EXISTS bank_applied_message_id ON bank_applied (message_id);
`

func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	// Several consumers start at once: serialise the DDL.
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(727274)"); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, schema); err != nil {
		return fmt.Errorf("create tables: %w", err)
	}
	return tx.Commit(ctx)
}

// transfer is the body of a message.
type transfer struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// parseTransfer is strict: a body that is not exactly that JSON, a missing
// account or a non-integer amount is rejected (dead-lettered as unparseable).
func parseTransfer(body []byte) (transfer, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&raw); err != nil {
		return transfer{}, fmt.Errorf("body is not a JSON object: %w", err)
	}
	if dec.More() {
		return transfer{}, errors.New("trailing data after the JSON object")
	}
	var t transfer
	acc, ok := raw["account"]
	if !ok {
		return t, errors.New(`missing "account"`)
	}
	if err := json.Unmarshal(acc, &t.Account); err != nil || t.Account == "" {
		return t, errors.New(`"account" must be a non-empty string`)
	}
	amt, ok := raw["amount"]
	if !ok {
		return t, errors.New(`missing "amount"`)
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(amt)), 10, 64)
	if err != nil {
		return t, fmt.Errorf(`"amount" must be an int64, got %s`, amt)
	}
	t.Amount = n
	return t, nil
}

const applySQL = `INSERT INTO accounts (id, balance) VALUES ($1, $2)
ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + EXCLUDED.balance`

func consume(ctx context.Context, o consumeOpts) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pcfg, err := pgxpool.ParseConfig(o.pgURL)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	pcfg.ConnConfig.ConnectTimeout = 5 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, pcfg) // lazy: connects on first use
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer pool.Close()
	// A process started while PostgreSQL is down (restarted by its
	// supervisor mid-outage) waits for it, as the consumer waits for the
	// broker, instead of exiting.
	if err := waitFor(ctx, log, "postgres", func(ctx context.Context) error { return migrate(ctx, pool) }); err != nil {
		if ctx.Err() != nil {
			return nil // SIGTERM while waiting: a clean exit
		}
		return err
	}
	probes := []func(context.Context) error{pool.Ping}
	q := bankQueue(o.queue, o.queueType)
	topo := topology.Topology{Queues: []topology.Queue{q}}
	setup := topology.SetupFunc(topo)
	var counters idemq.Counters
	var m *metrics.Metrics
	var consumerRec *metrics.ConsumerRecorder
	recorder, pubRecorder := idemq.Recorder(&counters), idemq.Recorder(&counters)
	if o.metricsAddr != "" {
		if m, err = metrics.New(metrics.Config{}); err != nil {
			return err
		}
		consumerRec = m.Consumer(o.queue, "bank")
		recorder = metrics.Tee(&counters, consumerRec)
		pubRecorder = metrics.Tee(&counters, m.Publisher("retry"))
	}
	urls := splitList(o.amqpURLs)
	amqpURL := o.amqpURL
	if len(urls) > 0 {
		amqpURL = ""
	}
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: amqpURL, URLs: urls, Setup: setup, Logger: log, Recorder: pubRecorder})
	if err != nil {
		return err
	}
	defer pub.Close()

	crash := func(point string) {
		if o.crash[point] && o.crashRate > 0 && rand.Float64() < o.crashRate {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never continue past a crash point
		}
	}
	effect := transferEffect(o.mode, o.failRate, func(context.Context) {
		crash(crashInHandler)
		o.freeze.hit()
	})
	ownTx := ownTxHandler(pool, effect, func(context.Context) { crash(crashAfterCommit) })

	policy, err := retry.New(retry.ForTopology(q, retry.Config{Sender: pub}))
	if err != nil {
		return err
	}
	var handler idemq.Handler
	var guard idemq.Layer
	mws := []idemq.Middleware{
		hook(func() { crash(crashBeforeAck) }, nil),
		hook(nil, func() { crash(crashBeforeClaim) }),
		requireID(),
	}
	switch o.mode {
	case "none":
		handler = ownTx
	case "dedup":
		rc, err := redisClient(o)
		if err != nil {
			return err
		}
		defer rc.Close()
		store, err := redisstore.New(rc, redisstore.Config{})
		if err != nil {
			return err
		}
		var guarded dedup.Store = store
		if m != nil {
			guarded = m.Store("redis", store)
		}
		g, err := dedup.NewGuard(dedup.Config{Store: guarded, Prefix: "bank", Lease: o.lease, Logger: log})
		if err != nil {
			return err
		}
		guard = g
		probes = append(probes, dedup.Probe(store))
		handler = ownTx
	case "inbox":
		var ib *inbox.Inbox[pgx.Tx]
		err := waitFor(ctx, log, "postgres (inbox table)", func(ctx context.Context) (err error) {
			icfg := inbox.Config{Logger: log}
			if m != nil {
				icfg.Observer = m.Inbox("bank")
			}
			ib, err = inbox.New(ctx, postgres.Pgx(pool), icfg)
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("inbox: %w", err)
		}
		probes = append(probes, ib.Probe)
		mws = append(mws, hook(func() { crash(crashAfterCommit) }, nil))
		handler = ib.Handler(effect)
	}
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{
		URL: amqpURL, URLs: urls, Queue: o.queue, Group: "bank", Prefetch: o.prefetch, Workers: o.workers,
		Setup: setup, Recorder: recorder, Logger: log,
		Pipeline:        idemq.Pipeline{Policy: policy, Middleware: mws, Guard: guard, Handler: handler},
		ShutdownTimeout: 10 * time.Second, Breaker: idemq.BreakerConfig{Probes: probes},
	})
	if err != nil {
		return err
	}
	if o.stats != "" {
		stopStats := writeStats(o.stats, &counters)
		defer stopStats()
	}
	if m != nil {
		consumerRec.Watch(c)
		// The breaker's probes: PostgreSQL, then the mode's store (the
		// dedup guard's Redis, the inbox table).
		checks := map[string]metrics.Check{"consumer": metrics.ConsumerReady(c), "postgres": probes[0]}
		if len(probes) > 1 {
			checks[o.mode] = probes[1]
		}
		stop, err := serveHealth(ctx, o.metricsAddr, metrics.HealthConfig{Gatherer: m.Gatherer(), Checks: checks})
		if err != nil {
			return err
		}
		defer stop()
	}
	return c.Run(ctx)
}

// transferEffect is the bank's effect: it applies a transfer in tx and
// records that it did, with the attempt (bank_applied is how the demo
// counts applications: it commits with the effect). Then, at failRate, it
// fails transiently (transient.go): the writes are rolled back. inHandler
// runs after the writes, before the commit (the crash and freeze hooks;
// idemqtest.CrashPoint in the kit's test).
func transferEffect(mode string, failRate float64, inHandler func(context.Context)) func(context.Context, pgx.Tx, *idemq.Delivery) error {
	return func(ctx context.Context, tx pgx.Tx, d *idemq.Delivery) error {
		t, err := parseTransfer(d.Body)
		if err != nil {
			return idemq.Reject(idemq.ReasonUnparseable, err)
		}
		if _, err := tx.Exec(ctx, applySQL, t.Account, t.Amount); err != nil {
			return fmt.Errorf("apply: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO bank_applied (message_id, mode, attempt) VALUES ($1, $2, $3)`,
			d.MessageID, mode, retry.Attempt(d.Headers)); err != nil {
			return fmt.Errorf("record: %w", err)
		}
		if err := failTransiently(ctx, d, failRate); err != nil {
			return err
		}
		inHandler(ctx)
		return nil
	}
}

// ownTxHandler runs effect in a transaction of its own (modes none and
// dedup); afterCommit runs once it committed.
//
// Under the dedup guard the handler's context is cancelled when its
// lease is lost (a process frozen past its lease). The transaction
// checks the lease as its last statement and commits on a context
// the lease does not cancel: a COMMIT already sent when the process
// froze must not be reported as failed once it wakes up (pgx would
// abandon it with "context canceled" although it landed, and the
// guard would give the delivery back to be applied again).
func ownTxHandler(pool *pgxpool.Pool, effect func(context.Context, pgx.Tx, *idemq.Delivery) error, afterCommit func(context.Context)) idemq.Handler {
	return idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		err := commitOwnTx(ctx, pool, func(tx pgx.Tx) error { return effect(ctx, tx, d) })
		if err != nil {
			return inbox.Classify(err) // a lost database is not the message's fault
		}
		afterCommit(ctx)
		return nil
	})
}

// serveHealth serves /metrics, /healthz and /readyz on addr until stop.
func serveHealth(ctx context.Context, addr string, cfg metrics.HealthConfig) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr %s: %w", addr, err)
	}
	srv := &http.Server{Handler: metrics.NewHealth(cfg), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}, nil
}

// commitTimeout bounds a COMMIT, which runs on a context the handler's
// cancellation does not reach.
const commitTimeout = 10 * time.Second

// commitOwnTx runs effect in a transaction and commits it. Inside a dedup
// guard it first checks, in the transaction, that the delivery's lease
// is still held ([dedup.Lease.Check] also renews it, so the COMMIT has a
// whole lease to land): a consumer frozen past its lease rolls back. The
// COMMIT itself runs on a context the lease loss does not cancel, so its
// outcome is read, not abandoned half-way.
func commitOwnTx(ctx context.Context, pool *pgxpool.Pool, effect func(pgx.Tx) error) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // no-op after Commit
	if err := effect(tx); err != nil {
		return err
	}
	if lease, ok := dedup.LeaseFrom(ctx); ok {
		if err := lease.Check(ctx); err != nil {
			var se *dedup.StoreError
			if errors.As(err, &se) {
				// The store cannot confirm the lease: do not commit on
				// it, and do not count an attempt against the message.
				return idemq.Unavailable(dedup.DependencyStore, err)
			}
			return fmt.Errorf("dedup lease before commit: %w", err)
		}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	return tx.Commit(cctx)
}

// freezeArmWindow is how long a SIGUSR1 from the demo keeps the freeze
// hook armed. The demo waits longer than that (freezeArmWait) for the
// process to stop itself before it stops it where it is, so a hook armed
// for a freeze the demo gave up on cannot stop the process later, with
// nobody left to send SIGCONT.
const freezeArmWindow = 4 * time.Second

// freezeArm is the demo's freeze hook (bank demo --freezes): SIGUSR1 arms
// it, and the first handler that reaches the in-handler point within
// freezeArmWindow — effect written, transaction not committed, dedup
// lease held (dedup mode) — stops the whole process with SIGSTOP, every
// other worker wherever it is. The demo that sent SIGUSR1 sees the
// process stopped and sends SIGCONT after the freeze.
type freezeArm struct {
	start time.Time
	until atomic.Int64 // armed until this long after start; 0: not armed
}

// newFreezeArm installs the SIGUSR1 handler (without it SIGUSR1 would
// end the process).
func newFreezeArm() *freezeArm {
	f := &freezeArm{start: time.Now()}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	go func() {
		for range ch {
			f.until.Store(int64(time.Since(f.start) + freezeArmWindow))
		}
	}()
	return f
}

// hit stops the process (SIGSTOP) if the hook is armed, once per SIGUSR1.
// A nil freezeArm does nothing.
func (f *freezeArm) hit() {
	if f == nil {
		return
	}
	u := f.until.Load()
	if u == 0 || time.Since(f.start) > time.Duration(u) || !f.until.CompareAndSwap(u, 0) {
		return
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
}

// hook runs after() when the wrapped handler succeeded, before() before it.
func hook(after, before func()) idemq.Middleware {
	return func(next idemq.Handler) idemq.Handler {
		return idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			if before != nil {
				before()
			}
			err := next.Handle(ctx, d)
			if (err == nil || idemq.IsDuplicate(err)) && after != nil { // about to be acked
				after()
			}
			return err
		})
	}
}

// requireID rejects a delivery without a usable message_id in every mode
// (in none mode nothing else would).
func requireID() idemq.Middleware {
	return func(next idemq.Handler) idemq.Handler {
		return idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			if err := idemq.ValidateID(d.MessageID); err != nil {
				if errors.Is(err, idemq.ErrMissingMessageID) {
					return idemq.Reject(idemq.ReasonMissingID, err)
				}
				return idemq.Reject(idemq.ReasonInvalidID, err)
			}
			return next.Handle(ctx, d)
		})
	}
}

// writeStats writes the counters to path (atomically) every 25ms.
func writeStats(path string, c *idemq.Counters) (stop func()) {
	write := func() {
		b, _ := json.Marshal(c.Snapshot())
		tmp := path + ".tmp"
		if os.WriteFile(tmp, b, 0o644) == nil {
			_ = os.Rename(tmp, path)
		}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(25 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				write()
				return
			case <-t.C:
				write()
			}
		}
	}()
	return func() { close(done); <-finished }
}

// redisClient is the dedup store's client: a Redis Cluster's when
// --redis-cluster is set, through the Sentinels when --redis-sentinels is
// set, else --redis.
func redisClient(o consumeOpts) (redis.UniversalClient, error) {
	if nodes := splitList(o.redisCluster); len(nodes) > 0 {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: nodes,
			DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second}), nil
	}
	if sents := splitList(o.sentinels); len(sents) > 0 {
		return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: o.master, SentinelAddrs: sents,
			DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second}), nil
	}
	opt, err := redis.ParseURL(o.redisURL)
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	return redis.NewClient(opt), nil
}

// splitList splits a comma-separated list, dropping empty entries.
func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
