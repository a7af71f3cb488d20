package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/bloom"
	"github.com/idemq/idemq/dedup/bloom/redisbloom"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/dedup/sqlstore"
	"github.com/idemq/idemq/doctor"
	"github.com/idemq/idemq/gate"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/metrics"
)

type gateFlags struct {
	from, to, routingKey, routes   string
	metricsListen                  string
	amqp, redisURL, redisKeyPrefix string
	managementURL                  string
	store, db, table               string
	bloomIDs                       uint64
	bloomFP                        float64
	group, prefix, dlq             string
	idHeader, idJSON               string
	window, lease, forwardTimeout  time.Duration
	workers, prefetch              int
	noCheck                        bool
	logInterval                    time.Duration
	logLevel, logFormat            string
}

const gateLong = `gate is a deduplicating forwarder: it consumes the ingress queue --from and
publishes each message, unchanged (body, every property, every header), to
the exchange --to (or to every route of --routes FILE), each message ID at
most once within --window. Consumers in any language read the target's
queues, where each ID appears once.

Per message: claim the ID in the dedup store (a lease), publish to every
route with publisher confirms (mandatory), mark the ID done, ack. A copy
whose ID is done within the window is acked and counted, never forwarded.
A message without an ID, or unroutable at a target, goes to the ingress
queue's dead-letter queue (<ingress>.dlq) with the reason in x-idemq-reason
(missing-id, invalid-id, unroutable, forward-refused); a missing target
exchange or a lost connection holds messages back, never drops them. Run
several gates on one ingress queue: they share the work and the records.

A gate killed after a message's confirm and before its ID is marked done
forwards that message again after --lease: the one duplicate it can make.

The ID is the AMQP message_id; --id-header NAME takes it from a header
first (--id-header x-deduplication-header migrates from the
rabbitmq-message-deduplication plugin), --id-json-field PATH from a JSON
body field.

Declare the ingress queue and its bindings with idemq topology apply
(queue with no_retry: true). The store is Redis (--redis-url, else
IDEMQ_REDIS_URL); --store postgres|mysql|sqlite --db DSN for a SQL store,
--store bloom-redis for the Bloom tier (size it with --bloom-expected-ids
per window). SIGTERM or SIGINT stops it after the forwards in flight.

routes.yaml:
  routes:
    - exchange: orders
      routing_key: orders.created   # optional: default the message's own
    - exchange: audit`

func newGateCmd() *cobra.Command {
	var f gateFlags
	cmd := &cobra.Command{
		Use:   "gate --from INGRESS (--to EXCHANGE [--routing-key K] | --routes routes.yaml)",
		Short: "Forward an ingress queue to exchanges, each message ID once (broker-layer dedup)",
		Long:  gateLong,
		Args:  cobra.NoArgs,
		RunE:  wrapRunE(func(cmd *cobra.Command, _ []string) error { return runGate(cmd, f) }),
	}
	fl := cmd.Flags()
	fl.StringVar(&f.from, "from", "", "ingress queue (required)")
	fl.StringVar(&f.to, "to", "", `target exchange ("" with --routing-key: the default exchange)`)
	fl.StringVar(&f.routingKey, "routing-key", "", "routing key for --to (default: the message's own)")
	fl.StringVar(&f.routes, "routes", "", "YAML file of routes (instead of --to)")
	fl.StringVar(&f.amqp, "amqp", "", "AMQP URL (default $IDEMQ_AMQP_URL)")
	fl.StringVar(&f.managementURL, "management-url", "", "RabbitMQ management API URL: the ingress queue's delivery limit (a policy's too) is read at each connect (default none)")
	fl.StringVar(&f.redisURL, "redis-url", "", "Redis URL (default $IDEMQ_REDIS_URL)")
	fl.StringVar(&f.redisURL, "redis", "", "alias of --redis-url")
	fl.StringVar(&f.redisKeyPrefix, "redis-key-prefix", "", "Redis key prefix of the store")
	fl.StringVar(&f.store, "store", "redis", "dedup store: redis, postgres, mysql, sqlite or bloom-redis")
	fl.StringVar(&f.db, "db", "", "database DSN for --store postgres|mysql|sqlite")
	fl.StringVar(&f.table, "table", "", "dedup table for a SQL store (default idemq_dedup)")
	fl.Uint64Var(&f.bloomIDs, "bloom-expected-ids", 1_000_000, "bloom-redis: IDs per window")
	fl.Float64Var(&f.bloomFP, "bloom-fp-rate", 1e-4, "bloom-redis: false-positive rate (a suspect is dead-lettered as suspected-duplicate, never dropped)")
	fl.StringVar(&f.group, "group", "", "dedup key group; gates sharing an ingress share it (default gate.<ingress>)")
	fl.StringVar(&f.prefix, "prefix", "idemq", "dedup key prefix")
	fl.StringVar(&f.dlq, "dlq", "", `dead-letter queue (default <ingress>.dlq; "-" for none)`)
	fl.StringVar(&f.idHeader, "id-header", "", "take the ID from this header first (e.g. x-deduplication-header)")
	fl.StringVar(&f.idJSON, "id-json-field", "", "take the ID from this JSON body field first (dot path)")
	fl.DurationVar(&f.window, "window", gate.DefaultWindow, "how long a forwarded ID is remembered")
	fl.DurationVar(&f.lease, "lease", gate.DefaultLease, "claim lease; a dead gate's messages wait at most this long")
	fl.DurationVar(&f.forwardTimeout, "forward-timeout", gate.DefaultForwardTimeout, "bound on forwarding one message before it is given back")
	fl.IntVar(&f.workers, "workers", gate.DefaultWorkers, "concurrent forwards")
	fl.IntVar(&f.prefetch, "prefetch", gate.DefaultPrefetch, "ingress prefetch")
	fl.BoolVar(&f.noCheck, "no-check", false, "do not check at start that the queues and exchanges exist")
	fl.DurationVar(&f.logInterval, "log-interval", time.Minute, "interval between counter log lines (0: only at exit)")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&f.logFormat, "log-format", "json", "json or text")
	fl.StringVar(&f.metricsListen, "metrics-listen", "", "serve /metrics, /healthz and /readyz on this address (host:port; empty: off)")
	return cmd
}

// gateConfig builds the gate's config from the flags (without the store).
func gateConfig(f gateFlags) (gate.Config, error) {
	if f.from == "" {
		return gate.Config{}, errors.New("--from INGRESS is required")
	}
	var routes []gate.Route
	switch {
	case f.routes != "" && (f.to != "" || f.routingKey != ""):
		return gate.Config{}, errors.New("--routes and --to/--routing-key: use one")
	case f.routes != "":
		r, err := gate.LoadRoutesFile(f.routes)
		if err != nil {
			return gate.Config{}, err
		}
		routes = r
	case f.to != "" || f.routingKey != "":
		routes = []gate.Route{{Exchange: f.to, RoutingKey: f.routingKey}}
	default:
		return gate.Config{}, errors.New("--to EXCHANGE or --routes FILE is required")
	}
	cfg := gate.Config{
		URL: amqpURL(f.amqp), ManagementURL: f.managementURL, Ingress: f.from, Routes: routes, Group: f.group, Prefix: f.prefix,
		RedisURL: redisURL(f.redisURL), RedisKeyPrefix: f.redisKeyPrefix, DeadLetterQueue: f.dlq,
		Window: f.window, Lease: f.lease, ForwardTimeout: f.forwardTimeout, Workers: f.workers, Prefetch: f.prefetch,
	}
	switch {
	case f.idHeader != "" && f.idJSON != "":
		return gate.Config{}, errors.New("--id-header and --id-json-field: use one")
	case f.idHeader != "":
		cfg.ID.Extractor = idemq.FromHeader(f.idHeader)
	case f.idJSON != "":
		cfg.ID.Extractor = idemq.FromJSONField(f.idJSON)
	}
	return cfg, cfg.Validate()
}

// gateStore opens the dedup store of --store; nil for redis (the gate
// opens its default store itself) unless IDEMQ_REDIS_CA names the CA of a
// rediss:// server, which the gate's own parse of the URL does not know.
func gateStore(ctx context.Context, log *slog.Logger, f gateFlags, window time.Duration) (dedup.Store, func(), error) {
	sc := sqlstore.Config{Table: f.table, PurgeInterval: 10 * time.Minute}
	needDB := func() error {
		if f.db == "" {
			return fmt.Errorf("--store %s needs --db", f.store)
		}
		return nil
	}
	switch f.store {
	case "", "redis":
		if os.Getenv(envRedisCA) == "" {
			return nil, func() {}, nil
		}
		opt, err := redisOptions(redisURL(f.redisURL))
		if err != nil {
			return nil, nil, fmt.Errorf("redis URL %s: %w", redactURL(redisURL(f.redisURL)), err)
		}
		rdb := redis.NewClient(opt)
		st, err := redisstore.New(rdb, redisstore.Config{KeyPrefix: f.redisKeyPrefix})
		if err != nil {
			rdb.Close()
			return nil, nil, err
		}
		return st, func() { rdb.Close() }, nil
	case "postgres", "mysql", "sqlite":
		if err := needDB(); err != nil {
			return nil, nil, err
		}
		d, err := resolveDB(f.db, f.store, os.Getenv)
		if err != nil {
			return nil, nil, err
		}
		db, closeDB, err := openDB(ctx, d)
		if err != nil {
			return nil, nil, err
		}
		var st *sqlstore.Store
		err = waitDB(ctx, log, d, "dedup store", func(ctx context.Context) (err error) {
			st, err = sqlstore.New(ctx, db, sc)
			return err
		})
		if err != nil {
			closeDB()
			return nil, nil, err
		}
		return st, func() { st.Close(); closeDB() }, nil
	case "bloom-redis":
		opt, err := redisOptions(redisURL(f.redisURL))
		if err != nil {
			return nil, nil, fmt.Errorf("redis URL %s: %w", redactURL(redisURL(f.redisURL)), err)
		}
		rdb := redis.NewClient(opt)
		st, err := redisbloom.NewStore(rdb, redisbloom.StoreConfig{Filter: redisbloom.Config{
			KeyPrefix: f.redisKeyPrefix,
			Filter:    bloom.FilterConfig{Window: window, ExpectedIDs: f.bloomIDs, FPRate: f.bloomFP},
		}})
		if err != nil {
			rdb.Close()
			return nil, nil, err
		}
		return st, func() { rdb.Close() }, nil
	}
	return nil, nil, fmt.Errorf("--store %q: want redis, postgres, mysql, sqlite or bloom-redis", f.store)
}

// gateStoreCheck is /readyz's probe of the dedup store of --store, on a
// connection of its own: a Redis PING, a SQL SELECT 1.
func gateStoreCheck(ctx context.Context, f gateFlags) (metrics.Check, func(), error) {
	switch f.store {
	case "", "redis", "bloom-redis":
		opt, err := redisOptions(redisURL(f.redisURL))
		if err != nil {
			return nil, nil, fmt.Errorf("redis URL %s: %w", redactURL(redisURL(f.redisURL)), err)
		}
		opt.MaxRetries = -1 // one attempt per probe: /readyz answers within its timeout
		rdb := redis.NewClient(opt)
		return func(ctx context.Context) error { return rdb.Ping(ctx).Err() }, func() { rdb.Close() }, nil
	case "postgres", "mysql", "sqlite":
		d, err := resolveDB(f.db, f.store, os.Getenv)
		if err != nil {
			return nil, nil, err
		}
		db, closeDB, err := openDB(ctx, d)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context) error {
			_, err := db.Exec(ctx, "SELECT 1")
			return err
		}, closeDB, nil
	}
	return nil, nil, fmt.Errorf("--store %q: want redis, postgres, mysql, sqlite or bloom-redis", f.store)
}

func runGate(cmd *cobra.Command, f gateFlags) (err error) {
	cfg, err := gateConfig(f)
	if err != nil {
		return err
	}
	secrets := append(redact.Secrets(cfg.URL), redact.Secrets(cfg.RedisURL)...)
	if f.db != "" {
		secrets = append(secrets, redact.Secrets(f.db)...)
	}
	defer func() { err = redactErr(err, secrets...) }()
	log, err := relayLogger(cmd, f.logLevel, f.logFormat, secrets)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	store, closeStore, err := gateStore(ctx, log, f, cfg.Window)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting for the store: a clean exit
		}
		return err
	}
	defer closeStore()
	if f.store == "" || f.store == "redis" || f.store == "bloom-redis" {
		// The gate is the only line for what it forwards: its Redis must
		// not evict nor forget done records. Logged once when not PASS.
		if opt, err := redisOptions(redisURL(f.redisURL)); err == nil {
			opt.MaxRetries = -1
			rdb := redis.NewClient(opt)
			doctorDone := make(chan struct{})
			doctorAtStart(ctx, log, doctor.Config{Redis: rdb, RedisAddr: "redis " + opt.Addr, RedisOnlyLine: true},
				func() { rdb.Close(); close(doctorDone) })
			defer func() { <-doctorDone }()
		}
	}
	cfg.Store, cfg.Logger = store, log
	var m *metrics.Metrics
	if f.metricsListen != "" {
		if m, err = metrics.New(metrics.Config{}); err != nil {
			return err
		}
		cfg.Store = m.Store(f.store, cfg.Store)
		group := cfg.Group
		if group == "" {
			group = gate.GroupPrefix + cfg.Ingress
		}
		cfg.Recorder = m.Consumer(cfg.Ingress, group)
	}
	g, err := gate.New(cfg)
	if err != nil {
		return err
	}
	if m != nil {
		storeCheck, closeCheck, err := gateStoreCheck(ctx, f)
		if err != nil {
			return err
		}
		defer closeCheck()
		stop, err := serveMetrics(ctx, f.metricsListen, log, metrics.HealthConfig{Gatherer: m.Gatherer(),
			Checks: map[string]metrics.Check{"broker": metrics.ConsumerReady(g), "store": storeCheck}})
		if err != nil {
			return err
		}
		defer stop()
	}
	if !f.noCheck {
		if err := g.Check(ctx); err != nil {
			return err
		}
	}
	logStats := func(msg string) {
		s := g.Stats()
		log.Info(msg, "received", s.Received, "forwarded", s.Forwarded, "duplicates", s.Duplicates,
			"deferred", s.Deferred, "dead_lettered", s.DeadLettered, "unroutable", s.Unroutable,
			"store_errors", s.StoreErrors, "leases_lost", s.LeasesLost, "forward_retries", s.Retries,
			"latency_p50_ms", float64(s.ForwardLatency.P50.Microseconds())/1000,
			"latency_p99_ms", float64(s.ForwardLatency.P99.Microseconds())/1000)
	}
	stopLog := every(ctx, f.logInterval, func() { logStats("idemq gate counters") })
	defer stopLog()
	log.Info("idemq gate started", "ingress", cfg.Ingress, "amqp", redactURL(cfg.URL), "store", f.store, "pid", os.Getpid())
	if err := g.Run(ctx); err != nil {
		return err
	}
	logStats("idemq gate drained and stopped")
	return nil
}
