package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/idemq/idemq/doctor"
	"github.com/idemq/idemq/internal/display"
	"github.com/idemq/idemq/retry"
)

type doctorFlags struct {
	file, url, mgmtURL, redisURL, db, dialect string
	redisCluster                              []string
	redisOnlyLine                             bool
	dedupTable, inboxTable, outboxTable       string
	dedupWindow, inboxWindow, dlRetention     time.Duration
	handlerTimeout, timeout                   time.Duration
	maxAttempts, quickAttempts                int
	output                                    string
}

// errDoctorFailed: at least one FAIL finding (printed already).
var errDoctorFailed = silentError{errors.New("doctor: a check failed")}

func newDoctorCmd() *cobra.Command {
	var f doctorFlags
	cmd := &cobra.Command{
		Use:   "doctor [-f FILE] [flags]",
		Short: "Check a deployment for the settings that silently break exactly-once",
		Long: `doctor reads the broker, Redis and the SQL database of a deployment, changes
nothing, and reports each check as PASS, WARN or FAIL, with what it means for
the guarantee and the exact fix. It exits 1 when a check FAILs, so it can gate
a deployment (a CI step, a Kubernetes init container).

What is checked is what is given:
  -f FILE            the topology: each queue, DLQ and retry queue exists
                     (--url, default $IDEMQ_AMQP_URL); with --management-url
                     (default $IDEMQ_RABBITMQ_MGMT_URL) their types and
                     arguments, the policies that drop, expire or limit
                     messages, the delivery limit the broker applies, a
                     queue's consumer timeout vs --handler-timeout
  --redis-url URL    the dedup store's Redis: maxmemory-policy (anything but
                     noeviction evicts done records), persistence (FAIL
                     without it when --redis-only-line), replicas, cluster
  --db URL           with --dedup-table, --inbox-table, --outbox-table:
                     migrations applied; the outbox's oldest pending row
                     and its failed rows
  --dedup-window, --inbox-window
                     against the longest retry horizon of the topology's
                     queues (their retry delays, --max-attempts,
                     --quick-attempts) plus --dead-letter-retention`,
		Args: cobra.NoArgs,
		RunE: wrapRunE(func(cmd *cobra.Command, _ []string) error { return runDoctor(cmd, f) }),
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.file, "file", "f", "", "topology YAML (- for stdin)")
	fl.StringVar(&f.url, "url", "", "AMQP URL (default $IDEMQ_AMQP_URL)")
	fl.StringVar(&f.mgmtURL, "management-url", "", "management API URL (default $IDEMQ_RABBITMQ_MGMT_URL)")
	fl.StringVar(&f.redisURL, "redis-url", "", "the dedup store's Redis URL (redis://, rediss://); empty: Redis not checked")
	fl.StringSliceVar(&f.redisCluster, "redis-cluster", nil, "the dedup store's Redis Cluster: seed addresses host:port,host:port (instead of --redis-url)")
	fl.BoolVar(&f.redisOnlyLine, "redis-only-line", false, "the Redis guard is the only defence (no inbox): a Redis without persistence FAILs")
	fl.StringVar(&f.db, "db", "", "database URL or DSN holding idemq's tables; empty: SQL not checked")
	fl.StringVar(&f.dialect, "dialect", "", "postgres, mysql or sqlite (default: from --db)")
	fl.StringVar(&f.dedupTable, "dedup-table", "", "the SQL dedup store's table to check")
	fl.StringVar(&f.inboxTable, "inbox-table", "", "the inbox table to check")
	fl.StringVar(&f.outboxTable, "outbox-table", "", "the outbox table to check")
	fl.DurationVar(&f.dedupWindow, "dedup-window", 0, "the dedup guard's window (dedup.Config.Window); 0: not checked")
	fl.DurationVar(&f.inboxWindow, "inbox-window", 0, "the inbox's retention (inbox.Config.Window); 0: not checked")
	fl.DurationVar(&f.dlRetention, "dead-letter-retention", 0, "how long a dead letter may wait before it is replayed")
	fl.DurationVar(&f.handlerTimeout, "handler-timeout", 0, "the consumers' handler deadline (ConsumerConfig.HandlerTimeout)")
	fl.IntVar(&f.maxAttempts, "max-attempts", 0, "retry.Config.MaxAttempts of the consumers (default: one per retry delay, plus one)")
	fl.IntVar(&f.quickAttempts, "quick-attempts", 0, "retry.Config.QuickAttempts of the consumers (default 3)")
	fl.DurationVar(&f.timeout, "timeout", 10*time.Second, "how long the checks of each dependency may take (the broker's include waiting for the management API to report a queue declared a moment ago)")
	addOutputFlag(cmd, &f.output)
	return cmd
}

func runDoctor(cmd *cobra.Command, f doctorFlags) error {
	cio, err := newIO(cmd, f.output)
	if err != nil {
		return err
	}
	cfg := doctor.Config{
		RedisOnlyLine: f.redisOnlyLine, DedupTable: f.dedupTable, InboxTable: f.inboxTable, OutboxTable: f.outboxTable,
		Retry:       retry.Config{MaxAttempts: f.maxAttempts, QuickAttempts: f.quickAttempts},
		DedupWindow: f.dedupWindow, InboxWindow: f.inboxWindow, DeadLetterRetention: f.dlRetention, HandlerTimeout: f.handlerTimeout,
		Timeout: f.timeout,
	}
	if f.file != "" {
		if cfg.Topology, err = loadTopologyFile(cio, "doctor", f.file); err != nil {
			return err
		}
		cfg.AMQPURL = amqpURL(f.url)
		cfg.ManagementURL = f.mgmtURL
		if cfg.ManagementURL == "" {
			cfg.ManagementURL = os.Getenv(envManagementURL)
		}
	}
	if len(f.redisCluster) > 0 {
		if f.redisURL != "" {
			return errors.New("give --redis-url or --redis-cluster, not both")
		}
		redis.SetLogger(silentRedisLog{})
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: f.redisCluster, MaxRetries: -1})
		defer c.Close()
		cfg.Redis = c
	}
	if f.redisURL != "" {
		redis.SetLogger(silentRedisLog{})
		opt, err := redisOptions(f.redisURL)
		if err != nil {
			return fmt.Errorf("--redis-url %s: %w", redactURL(f.redisURL), err)
		}
		opt.MaxRetries = -1
		c := redis.NewClient(opt)
		defer c.Close()
		cfg.Redis, cfg.RedisAddr = c, "redis "+opt.Addr
	}
	if (f.dedupTable != "" || f.inboxTable != "" || f.outboxTable != "") && f.db == "" {
		return errors.New("--dedup-table, --inbox-table and --outbox-table need --db")
	}
	if f.db != "" {
		_, _, db, closeDB, err := connect(cmd, f.db, f.dialect)
		if err != nil {
			return err
		}
		defer closeDB()
		cfg.DB = db
	}
	if f.file == "" && cfg.Redis == nil && cfg.DB == nil && f.dedupWindow == 0 && f.inboxWindow == 0 {
		return errors.New("nothing to check: give -f FILE, --redis-url, --db or a window (see idemq doctor --help)")
	}
	rep, err := doctor.Run(cmd.Context(), cfg)
	if err != nil {
		return err
	}
	if cio.json {
		if err := cio.printJSON(map[string]any{"findings": rep.Findings, "worst": rep.Worst(),
			"pass": rep.Count(doctor.Pass), "warn": rep.Count(doctor.Warn), "fail": rep.Count(doctor.Fail)}); err != nil {
			return err
		}
	} else {
		printDoctor(cio, rep)
	}
	if rep.Worst() == doctor.Fail {
		return errDoctorFailed
	}
	return nil
}

func printDoctor(cio *cmdIO, rep doctor.Report) {
	tw := tabwriter.NewWriter(cio.out, 0, 4, 2, ' ', 0)
	for _, f := range rep.Findings {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Status, f.Check, f.Subject, display.OneLine(f.Detail, 400))
		if f.Status != doctor.Pass {
			if f.Meaning != "" {
				fmt.Fprintf(tw, "\t\t\tmeans: %s\n", display.OneLine(f.Meaning, 400))
			}
			if f.Fix != "" {
				fmt.Fprintf(tw, "\t\t\tfix: %s\n", display.OneLine(f.Fix, 400))
			}
		}
	}
	_ = tw.Flush()
	fmt.Fprintf(cio.out, "\n%d pass, %d warn, %d fail\n", rep.Count(doctor.Pass), rep.Count(doctor.Warn), rep.Count(doctor.Fail))
}

// doctorAtStart runs the doctor on what a long-running command (relay,
// gate) uses, in the background (doctor.AtStart), and calls done when it
// has finished. It never stops the command.
func doctorAtStart(ctx context.Context, log *slog.Logger, cfg doctor.Config, done func()) {
	run := doctor.AtStart(log, cfg)
	go func() {
		defer done()
		run(ctx)
	}()
}
