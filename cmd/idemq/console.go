package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/console"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/topology"
)

// Environment variables of the console command.
const (
	envConsoleToken  = "IDEMQ_CONSOLE_TOKEN"
	envConsoleQueues = "IDEMQ_CONSOLE_QUEUES"
)

type consoleFlags struct {
	listen, token, amqp, redis, db, dialect, table string
	queues                                         []string
	topologyFile                                   string
	readOnly, noRedis, noDB                        bool
	keyPrefix, redisKeyPrefix                      string
	logLevel, logFormat                            string
}

func newConsoleCmd() *cobra.Command {
	var f consoleFlags
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the web console: dead letters by cause, replay, purge, dedup keys, outbox, live rates",
		Long: `console serves a web console for operators on --listen (default
127.0.0.1:8080, loopback only). On any other address it refuses to start
without a token (--token or IDEMQ_CONSOLE_TOKEN, 16+ characters), and every
request must then carry it (the login form sets a cookie; scripts send
Authorization: Bearer TOKEN). State changes are POSTs with a CSRF token and
a confirmation page showing the count; --read-only refuses them all.

Dead letters: the dead-letter queues of --queue (repeatable; or
IDEMQ_CONSOLE_QUEUES, comma-separated; or every queue of --topology FILE),
grouped by reason and error text with numbers and IDs masked. A replay goes
to the failed work queue only, never to a route from the message's headers.
Archive copies dead letters to QUEUE.dlq.archive. Dedup keys: the Redis
store of --redis (default IDEMQ_REDIS_URL; --no-redis hides the page).
Outbox: the table of --db (as for relay; default IDEMQ_OUTBOX_DB_URL or
IDEMQ_POSTGRES_URL; --no-db hides the page). The broker is --amqp, else
IDEMQ_AMQP_URL. No password or DSN secret is ever rendered.`,
		Args: cobra.NoArgs,
		RunE: wrapRunE(func(cmd *cobra.Command, _ []string) error { return runConsole(cmd, f) }),
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", console.DefaultListen, "listen address (beyond loopback a token is required)")
	fl.StringVar(&f.token, "token", "", "token every request must carry (default $"+envConsoleToken+")")
	fl.BoolVar(&f.readOnly, "read-only", false, "refuse every state change")
	fl.StringVar(&f.amqp, "amqp", "", "AMQP URL (default $"+envAMQPURL+")")
	fl.StringSliceVar(&f.queues, "queue", nil, "work queue (or QUEUE.dlq) whose dead letters to show (repeatable; default $"+envConsoleQueues+")")
	fl.StringVar(&f.topologyFile, "topology", "", "topology YAML: show every queue of it")
	fl.StringVar(&f.redis, "redis", "", "Redis URL of the dedup store (default $"+envRedisURL+")")
	fl.BoolVar(&f.noRedis, "no-redis", false, "no dedup keys page")
	fl.StringVar(&f.keyPrefix, "prefix", "idemq", "key prefix of the dedup guard (dedup.Config.Prefix)")
	fl.StringVar(&f.redisKeyPrefix, "redis-key-prefix", "", "Redis key prefix of the store (redisstore.Config.KeyPrefix)")
	fl.StringVar(&f.db, "db", "", "outbox database URL or DSN, as for relay")
	fl.StringVar(&f.dialect, "dialect", "", "postgres, mysql or sqlite (default: from --db)")
	fl.StringVar(&f.table, "table", outbox.DefaultTable, "outbox table")
	fl.BoolVar(&f.noDB, "no-db", false, "no outbox page")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&f.logFormat, "log-format", "text", "json or text")
	return cmd
}

// consoleQueues are the queues of the flags, the env and the topology file.
func consoleQueues(f consoleFlags, getenv func(string) string) ([]console.Queue, error) {
	var qs []console.Queue
	names := f.queues
	if len(names) == 0 && f.topologyFile == "" {
		names = strings.Split(getenv(envConsoleQueues), ",")
	}
	for _, q := range names {
		if q = strings.TrimSpace(q); q != "" {
			qs = append(qs, console.QueueOf(q))
		}
	}
	if f.topologyFile != "" {
		t, err := topology.LoadFile(f.topologyFile)
		if err != nil {
			return nil, err
		}
		for _, q := range t.Queues {
			if p := topology.ForQueue(q); p.DLQ != "" {
				qs = append(qs, console.Queue{Work: p.Queue, DLQ: p.DLQ})
			}
		}
	}
	if len(qs) == 0 {
		return nil, errors.New("name the queues to show: --queue QUEUE (repeatable), --topology FILE or " + envConsoleQueues)
	}
	return qs, nil
}

func runConsole(cmd *cobra.Command, f consoleFlags) (err error) {
	amqpU := amqpURL(f.amqp)
	token := f.token
	if token == "" {
		token = os.Getenv(envConsoleToken)
	}
	secrets := redact.Secrets(amqpU)
	if token != "" {
		secrets = append(secrets, token)
	}
	defer func() { err = redactErr(err, secrets...) }()
	log, err := relayLogger(cmd, f.logLevel, f.logFormat, secrets)
	if err != nil {
		return err
	}
	queues, err := consoleQueues(f, os.Getenv)
	if err != nil {
		return err
	}
	cfg := console.Config{Listen: f.listen, Token: token, ReadOnly: f.readOnly, AMQPURL: amqpU, Queues: queues,
		KeyPrefix: f.keyPrefix, Logger: log}
	// Refuse a bad listen address before opening anything.
	if err := cfg.Validate(); err != nil {
		return err
	}
	if !f.noRedis {
		u := redisURL(f.redis)
		opt, err := redisOptions(u)
		if err != nil {
			return fmt.Errorf("--redis %s: %w", redactURL(u), err)
		}
		secrets = append(secrets, redact.Secrets(u)...)
		client := redis.NewClient(opt)
		defer client.Close()
		cfg.Keys, err = redisstore.New(client, redisstore.Config{KeyPrefix: f.redisKeyPrefix})
		if err != nil {
			return err
		}
	}
	if !f.noDB {
		d, err := resolveDB(f.db, f.dialect, os.Getenv)
		switch {
		case err != nil && f.db == "" && f.dialect == "":
			log.Info("console: no outbox database (--db); outbox page off", "why", err.Error())
		case err != nil:
			return err
		default:
			secrets = append(secrets, redact.Secrets(d.DSN)...)
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			db, closeDB, err := openDB(ctx, d)
			if err != nil {
				return err
			}
			defer closeDB()
			// The console reads and re-drives rows; it never changes the
			// schema (idemq migrate does).
			sq, err := outbox.NewStore(ctx, db, outbox.StoreConfig{Table: f.table, NoMigrate: true})
			if err != nil {
				return err
			}
			cfg.Outbox = console.SQLOutbox(sq)
		}
	}
	cfg.Secrets = secrets
	srv, err := console.New(cfg)
	if err != nil {
		return err
	}
	defer srv.Close()
	log.Info("idemq console", "url", "http://"+f.listen+"/", "queues", queues, "redis", !f.noRedis, "outbox", cfg.Outbox != nil)
	return srv.ListenAndServe(cmd.Context())
}
