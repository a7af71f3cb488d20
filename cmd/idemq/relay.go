package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/doctor"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/metrics"
	"github.com/idemq/idemq/outbox"
)

// Environment variables of the relay command.
const (
	envOutboxDB   = "IDEMQ_OUTBOX_DB_URL" // any dialect; wins over the two below
	envPostgreURL = "IDEMQ_POSTGRES_URL"
	envMySQLURL   = "IDEMQ_MYSQL_URL"
)

type relayFlags struct {
	db, dialect, amqp, table   string
	metricsListen              string
	batch, maxAttempts         int
	concurrency                int
	lease, publishTimeout      time.Duration
	drainTimeout               time.Duration
	poll, maxPoll              time.Duration
	retention, purgeInterval   time.Duration
	statsInterval, logInterval time.Duration
	noNotify, ordered          bool
	noMigrate, deleteSent      bool
	logLevel, logFormat        string
}

func newRelayCmd() *cobra.Command {
	var f relayFlags
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Publish committed transactional-outbox rows with confirms",
		Long: `relay runs the outbox relay as a daemon: it claims committed rows of the
outbox table, publishes each with publisher confirms, marks it sent after its
confirm, marks unroutable or repeatedly failing rows failed with the reason,
and purges sent rows after the retention. Several relays may share one
PostgreSQL or MySQL/MariaDB table (FOR UPDATE SKIP LOCKED); run one per SQLite
file. SIGTERM or SIGINT stops it after the batch in flight is published and
marked; it then exits 0.

--db takes postgres://… (LISTEN/NOTIFY wakes the relay at once), mysql://…
(either a go-sql-driver DSN after the scheme, mysql://user:pass@tcp(host:3306)/db,
or a URL, mysql://user:pass@host:3306/db), a bare go-sql-driver DSN
(user:pass@tcp(host:3306)/db), or a SQLite database (sqlite://path or
file:path). Anything else needs --dialect: a PostgreSQL keyword/value DSN
(host=… user=… --dialect postgres), a plain SQLite path (--dialect sqlite).
A DSN the relay cannot place is refused, never opened as a SQLite file.
Without --db: IDEMQ_OUTBOX_DB_URL, else IDEMQ_MYSQL_URL for --dialect mysql,
else IDEMQ_POSTGRES_URL. Without --amqp: IDEMQ_AMQP_URL. Passwords and
secret parameters never reach the logs or errors.`,
		Args: cobra.NoArgs,
		RunE: wrapRunE(func(cmd *cobra.Command, _ []string) error { return runRelay(cmd, f) }),
	}
	fl := cmd.Flags()
	fl.StringVar(&f.db, "db", "", "database URL or DSN (default $IDEMQ_OUTBOX_DB_URL, $IDEMQ_POSTGRES_URL)")
	fl.StringVar(&f.dialect, "dialect", "", "postgres, mysql or sqlite (default: from --db)")
	fl.StringVar(&f.amqp, "amqp", "", "AMQP URL (default $IDEMQ_AMQP_URL)")
	fl.StringVar(&f.table, "table", outbox.DefaultTable, "outbox table")
	fl.IntVar(&f.batch, "batch", 256, "rows claimed and published concurrently per batch")
	fl.IntVar(&f.concurrency, "concurrency", 8, "batches in flight at once; keep batch×concurrency within the publisher's 4096 in-flight confirms")
	fl.DurationVar(&f.lease, "lease", 60*time.Second, "claim lease; a crashed relay's rows are resent after it")
	fl.DurationVar(&f.publishTimeout, "publish-timeout", 0, "bound on one publish (default lease/3)")
	fl.DurationVar(&f.drainTimeout, "drain-timeout", 5*time.Second, "on SIGTERM, how long to wait for publishes in flight before handing their rows back")
	fl.DurationVar(&f.poll, "poll", 50*time.Millisecond, "first idle poll interval")
	fl.DurationVar(&f.maxPoll, "max-poll", time.Second, "longest idle poll interval (the fallback with LISTEN/NOTIFY)")
	fl.BoolVar(&f.noNotify, "no-notify", false, "PostgreSQL: poll only, no LISTEN/NOTIFY")
	fl.BoolVar(&f.noMigrate, "no-migrate", false, "do not create/upgrade the outbox table")
	fl.BoolVar(&f.ordered, "ordered", false, "publish the messages of one ordering key one at a time, in order")
	fl.IntVar(&f.maxAttempts, "max-attempts", 10, "attempts before a row is marked failed")
	fl.DurationVar(&f.retention, "retention", 24*time.Hour, "keep sent rows this long (negative: forever)")
	fl.BoolVar(&f.deleteSent, "delete-sent", false, "delete a row once published instead of keeping it as sent for --retention (less database work per row)")
	fl.DurationVar(&f.purgeInterval, "purge-interval", time.Minute, "interval between purges")
	fl.DurationVar(&f.statsInterval, "stats-interval", 5*time.Second, "interval between lag refreshes")
	fl.DurationVar(&f.logInterval, "log-interval", time.Minute, "interval between counter log lines (0: only at exit)")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&f.logFormat, "log-format", "json", "json or text")
	fl.StringVar(&f.metricsListen, "metrics-listen", "", "serve /metrics, /healthz and /readyz on this address (host:port; empty: off)")
	cmd.AddCommand(newRelayFailedCmds()...)
	return cmd
}

func relayLogger(cmd *cobra.Command, level, format string, secrets []string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	w := redactWriter{w: cmd.ErrOrStderr(), secrets: secrets}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want json or text", format)
}

// relaySecrets are the secrets of every URL and DSN the relay may use,
// scrubbed literally from its logs and errors on top of the structural
// redaction (a driver's message quotes what it likes).
func relaySecrets(f relayFlags, amqpU string, getenv func(string) string) []string {
	s := redact.Secrets(amqpU)
	for _, db := range []string{f.db, getenv(envOutboxDB), getenv(envMySQLURL), getenv(envPostgreURL)} {
		if db != "" {
			s = append(s, redact.Secrets(db)...)
		}
	}
	return s
}

func runRelay(cmd *cobra.Command, f relayFlags) (err error) {
	amqpU := amqpURL(f.amqp)
	secrets := relaySecrets(f, amqpU, os.Getenv)
	defer func() { err = redactErr(err, secrets...) }()
	log, err := relayLogger(cmd, f.logLevel, f.logFormat, secrets)
	if err != nil {
		return err
	}
	ctx, d, db, closeDB, err := connect(cmd, f.db, f.dialect)
	if err != nil {
		return err
	}
	defer closeDB()
	var store *outbox.SQLStore
	err = waitDB(ctx, log, d, "outbox database", func(ctx context.Context) (err error) {
		store, err = openStore(ctx, d, db, f.table, f.noMigrate, f.deleteSent)
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting: a clean exit
		}
		return err
	}
	if err := checkBroker(ctx, log, amqpU, 10*time.Second); err != nil {
		return err
	}
	// The outbox table's migrations, lag and failed rows, logged once
	// when not PASS (idemq doctor).
	doctorDone := make(chan struct{})
	doctorAtStart(ctx, log, doctor.Config{DB: db, OutboxTable: f.table}, func() { close(doctorDone) })
	defer func() { <-doctorDone }()
	var counters idemq.Counters
	var rec idemq.Recorder = &counters
	var pubRec idemq.Recorder
	if f.metricsListen != "" {
		m, err := metrics.New(metrics.Config{})
		if err != nil {
			return err
		}
		rec = metrics.Tee(&counters, m.Relay(f.table))
		pubRec = m.Publisher("relay")
		stop, err := serveMetrics(ctx, f.metricsListen, log, metrics.HealthConfig{Gatherer: m.Gatherer()})
		if err != nil {
			return err
		}
		defer stop()
	}
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: amqpU, Logger: log, Recorder: pubRec})
	if err != nil {
		return err
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(outbox.RelayConfig{
		Store: store, Publisher: pub, BatchSize: f.batch, Concurrency: f.concurrency, Lease: f.lease, PublishTimeout: f.publishTimeout, DrainTimeout: f.drainTimeout,
		PollInterval: f.poll, MaxPollInterval: f.maxPoll, DisableNotify: f.noNotify, Ordered: f.ordered,
		MaxAttempts: f.maxAttempts, Retention: f.retention, PurgeInterval: f.purgeInterval,
		StatsInterval: f.statsInterval, Recorder: rec, Logger: log,
	})
	if err != nil {
		return err
	}
	log.Info("idemq relay starting", "dialect", d.Dialect, "db", d.Redacted(), "amqp", redactURL(amqpU),
		"table", f.table, "owner", relay.Owner())

	logCounters := func(msg string) {
		log.Info(msg,
			"published", counters.Get(outbox.CountRelayPublished),
			"failed", counters.Get(outbox.CountRelayFailed),
			"retried", counters.Get(outbox.CountRelayRetried),
			"purged", counters.Get(outbox.CountRelayPurged),
			"store_errors", counters.Get(outbox.CountRelayErrors),
			"pending", relay.Pending(),
			"lag_ms", relay.Lag().Milliseconds())
	}
	stopLog := every(ctx, f.logInterval, func() { logCounters("idemq relay counters") })
	defer stopLog()
	if err := relay.Run(ctx); err != nil {
		return err
	}
	logCounters("idemq relay drained and stopped")
	return nil
}
