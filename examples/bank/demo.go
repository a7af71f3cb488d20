// The demo's entry point: its flags (demoOpts), the modes it runs, and
// demoMain, which runs every mode in turn (run.go), prints the ledgers
// (report.go) and turns them into the exit status.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/idemq/idemq/topology"
)

type demoOpts struct {
	amqpURL, pgURL, redisURL string
	// A cluster (make cluster-chaos): the nodes' URLs and the Redis
	// Sentinels, comma-separated, the primary's name, and the faults
	// scripts/cluster.sh injects mid-run, in order.
	amqpURLs, sentinels, master string
	// redisCluster: a Redis Cluster's seed nodes; the dedup modes' store
	// goes through it (replaces --redis-sentinels).
	redisCluster             string
	clusterFaults            []string
	clusterScript            string
	messages, kills, cuts    int
	consumers                int
	resendPct                int
	crashRate                float64
	modes                    []string
	timeout                  time.Duration
	queueType                string
	jsonOut                  string
	redisRestarts, proxyCuts int
	brokerRestarts           int
	// Dependency outages: the mode's PostgreSQL (a private server of the
	// demo's, pg) and the dedup modes' private Redis are stopped for a
	// while during the backlog.
	dbOutages, redisOutages     int
	dbOutageDur, redisOutageDur time.Duration
	// dbOutageShapes: the shape of each database outage, in turn
	// (stop, stall, refuse; postgres.go).
	dbOutageShapes []string
	pg             *privatePostgres
	// Freezes: a running consumer is stopped (SIGSTOP) mid-handler for
	// freezeDur, then continued (SIGCONT).
	freezes   int
	freezeDur time.Duration
	// failRate is the fraction of transfers whose handler fails
	// transiently on their first one or two attempts (transient.go).
	failRate float64
}

// consumerLease is the dedup lease of the demo's consumers (bank consume
// --lease): short, so that a freeze of a few seconds outlives it.
const consumerLease = 2 * time.Second

// Mode names. modeDedupNoPersist is dedup against a private Redis without
// any persistence: what a Redis restart does to dedup records nobody kept.
const (
	modeNone           = "none"
	modeDedup          = "dedup"
	modeDedupNoPersist = "dedup-nopersist"
	modeInbox          = "inbox"
)

// consumerMode is the `bank consume --mode` a demo mode runs.
func consumerMode(mode string) string {
	if mode == modeDedupNoPersist {
		return modeDedup
	}
	return mode
}

// isDedup reports whether a demo mode uses a dedup store (Redis).
func isDedup(mode string) bool { return mode == modeDedup || mode == modeDedupNoPersist }

func demoMain(args []string) error {
	o, err := parseDemoFlags(args)
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	if o.dbOutages > 0 {
		pg, err := startPrivatePostgres(ctx)
		if err != nil {
			return fmt.Errorf("--db-outages %d: %w", o.dbOutages, err)
		}
		defer pg.remove()
		o.pg, o.pgURL = pg, pg.url()
	}
	printBanner(o)
	var ledgers []*ledger
	for _, m := range o.modes {
		fmt.Printf("running mode %-15s ... ", m)
		start := time.Now()
		l, err := runMode(ctx, o, m)
		if err != nil {
			return fmt.Errorf("mode %s: %w", m, err)
		}
		fmt.Printf("done in %.1fs\n", time.Since(start).Seconds())
		ledgers = append(ledgers, l)
	}
	fmt.Println()
	printLedgers(os.Stdout, ledgers)
	if o.jsonOut != "" {
		if err := writeLedgers(o.jsonOut, ledgers); err != nil {
			return err
		}
	}
	return verdict(ledgers)
}

// verdict is the demo's exit status: inbox must be exact, no mode may
// lose a transfer, and no transfer meant to fail transiently may have
// been applied at an attempt that failed.
func verdict(ledgers []*ledger) error {
	for _, l := range ledgers {
		if l.mode == modeInbox && !l.exact() {
			return errors.New("inbox mode was not exact: this is a bug")
		}
		if l.lost > 0 {
			return fmt.Errorf("mode %s lost %d transfers: this is a bug", l.mode, l.lost)
		}
		if l.late > 0 || l.heldByBroker > 0 {
			return fmt.Errorf("mode %s: %d transfers late, still queued (%v), %d messages held by the broker: not lost, but not applied by the deadline; the queues are kept",
				l.mode, l.late, l.lateWhere, l.heldByBroker)
		}
		if l.transientEarly > 0 {
			return fmt.Errorf("mode %s applied %d transfers at an attempt that failed: a failed attempt left its effect", l.mode, l.transientEarly)
		}
	}
	return nil
}

// printBanner says what the run will do, per mode.
func printBanner(o demoOpts) {
	fmt.Printf("idemq bank demo: %d transfers per mode (+%d%% resent with the same ID, +%d malformed), %d consumer processes,\n",
		o.messages, o.resendPct, len(badMessages()), o.consumers)
	fmt.Printf("%d kill -9 per mode + self-kills at every crash point (rate %.3f), %d broker connection cut(s),\n",
		o.kills, o.crashRate, o.cuts)
	fmt.Printf("%d proxy cut(s) of every consumer connection, %d kill -9 + restart(s) of the dedup modes' private Redis,\n",
		o.proxyCuts, o.redisRestarts)
	fmt.Printf("%d broker restart(s), %d PostgreSQL outage(s) of %v (%s, in turn), %d Redis outage(s) of %v,\n",
		o.brokerRestarts, o.dbOutages, o.dbOutageDur, strings.Join(o.dbOutageShapes, ", "), o.redisOutages, o.redisOutageDur)
	fmt.Printf("%d consumer freeze(s) (SIGSTOP mid-handler) of %v (dedup lease %v),\n", o.freezes, o.freezeDur, consumerLease)
	fmt.Printf("%.3f of the transfers failing transiently on their first one or two attempts (retry queues %v).\n\n",
		o.failRate, topology.ForQueue(bankQueue("bank", o.queueType)).Delays)
}

// parseDemoFlags parses `bank demo`'s flags and resolves their defaults
// (-1 as many as --cuts, the modes, the first cluster URL).
func parseDemoFlags(args []string) (demoOpts, error) {
	var o demoOpts
	var modes, clusterFaults, dbShapes string
	fs := demoFlagSet(&o, &modes, &clusterFaults, &dbShapes)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	if urls := splitList(o.amqpURLs); len(urls) > 0 && !explicit["amqp"] {
		o.amqpURL = urls[0]
	}
	for _, f := range splitList(clusterFaults) {
		switch f {
		case "leader-kill", "rolling", "outage", "redis-failover", "redis-cluster-kill":
			o.clusterFaults = append(o.clusterFaults, f)
		default:
			return o, fmt.Errorf("--cluster-faults: unknown fault %q", f)
		}
	}
	for _, f := range o.clusterFaults {
		if f == "redis-failover" && o.sentinels == "" {
			return o, fmt.Errorf("--cluster-faults redis-failover: needs --redis-sentinels")
		}
		if f == "redis-cluster-kill" && o.redisCluster == "" {
			return o, fmt.Errorf("--cluster-faults redis-cluster-kill: needs --redis-cluster")
		}
	}
	if o.sentinels != "" && o.redisCluster != "" {
		return o, fmt.Errorf("--redis-sentinels and --redis-cluster: pick one")
	}
	for _, sh := range splitList(dbShapes) {
		switch sh {
		case shapeStop, shapeStall, shapeRefuse:
			o.dbOutageShapes = append(o.dbOutageShapes, sh)
		default:
			return o, fmt.Errorf("--db-outage-shapes: unknown shape %q (stop, stall, refuse)", sh)
		}
	}
	if len(o.dbOutageShapes) == 0 {
		o.dbOutageShapes = []string{shapeStop}
	}
	if o.failRate < 0 || o.failRate > 1 {
		return o, fmt.Errorf("--fail-rate %g: want a fraction in [0, 1]", o.failRate)
	}
	if err := o.resolveRedis(explicit, modes); err != nil {
		return o, err
	}
	return o, o.parseModes(modes)
}

// resolveRedis resolves --redis-restarts and --proxy-cuts -1 (as many as
// --cuts) and checks that redis-server is there when a Redis of the
// demo's own is asked for.
func (o *demoOpts) resolveRedis(explicit map[string]bool, modes string) error {
	if o.redisRestarts < 0 {
		o.redisRestarts = o.cuts
	}
	if o.proxyCuts < 0 {
		o.proxyCuts = o.cuts
	}
	if o.redisRestarts > 0 {
		if _, err := exec.LookPath("redis-server"); err != nil {
			if explicit["redis-restarts"] || strings.Contains(modes, modeDedupNoPersist) {
				return fmt.Errorf("--redis-restarts %d: %w", o.redisRestarts, errNoRedisServer)
			}
			fmt.Fprintf(os.Stderr, "(Redis restarts skipped: %v; dedup uses the shared Redis)\n", errNoRedisServer)
			o.redisRestarts = 0
		}
	}
	if o.redisOutages > 0 {
		if _, err := exec.LookPath("redis-server"); err != nil {
			return fmt.Errorf("--redis-outages %d: %w", o.redisOutages, errNoRedisServer)
		}
	}
	return nil
}

// parseModes sets o.modes from --modes (its default depends on
// --redis-restarts, resolved before).
func (o *demoOpts) parseModes(modes string) error {
	if modes == "" {
		modes = "none,dedup,inbox"
		if o.redisRestarts > 0 {
			modes = "none,dedup,dedup-nopersist,inbox"
		}
	}
	for _, m := range strings.Split(modes, ",") {
		switch m = strings.TrimSpace(m); m {
		case modeNone, modeDedup, modeDedupNoPersist, modeInbox:
			o.modes = append(o.modes, m)
		case "":
		default:
			return fmt.Errorf("--modes: unknown mode %q", m)
		}
	}
	return nil
}

// demoFlagSet declares `bank demo`'s flags into o, and the list flags
// parsed afterwards into modes, clusterFaults and dbShapes.
func demoFlagSet(o *demoOpts, modes, clusterFaults, dbShapes *string) *flag.FlagSet {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.StringVar(&o.amqpURL, "amqp", envOr("IDEMQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "AMQP URL")
	fs.StringVar(&o.pgURL, "postgres", envOr("IDEMQ_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "PostgreSQL URL (a database per mode is created next to it)")
	fs.StringVar(&o.redisURL, "redis", envOr("IDEMQ_REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis URL")
	fs.IntVar(&o.messages, "messages", 2000, "unique transfers per mode")
	fs.IntVar(&o.kills, "kills", 3, "consumers SIGKILLed at random moments, per mode")
	fs.IntVar(&o.cuts, "cuts", 1, "broker connection cuts (rabbitmqctl close_all_connections), per mode")
	fs.IntVar(&o.consumers, "consumers", 2, "consumer processes")
	fs.IntVar(&o.resendPct, "resend", 10, "percent of transfers the publisher sends twice (same message ID)")
	fs.Float64Var(&o.crashRate, "crash-rate", 0.002, "per-delivery probability of a consumer SIGKILLing itself at each crash point (before claim, in handler, after commit, before ack)")
	fs.StringVar(modes, "modes", "", "modes to run, of none,dedup,dedup-nopersist,inbox (default none,dedup,inbox, plus dedup-nopersist when --redis-restarts > 0)")
	fs.IntVar(&o.redisRestarts, "redis-restarts", -1, "with N > 0, the dedup modes use a private redis-server (dedup: --appendonly yes --appendfsync always; dedup-nopersist: no persistence) that is SIGKILLed and restarted N times mid-run; 0: dedup uses the shared Redis; -1: as many as --cuts")
	fs.IntVar(&o.proxyCuts, "proxy-cuts", -1, "consumers reach the broker through a TCP proxy of the demo's that cuts all their connections N times mid-run, per mode (0: no proxy; -1: as many as --cuts)")
	fs.IntVar(&o.brokerRestarts, "broker-restarts", 0, "restarts of the broker (rabbitmqctl stop_app, start_app) mid-run, per mode: every client of the broker sees them")
	fs.IntVar(&o.dbOutages, "db-outages", 0, "with N > 0, the demo runs a private PostgreSQL of its own (initdb) and stops it (pg_ctl stop -m immediate) for --db-outage-duration N times mid-run, per mode")
	fs.DurationVar(&o.dbOutageDur, "db-outage-duration", 5*time.Second, "how long each --db-outages outage lasts")
	fs.StringVar(dbShapes, "db-outage-shapes", shapeStop, "comma-separated shapes the --db-outages take in turn: stop (pg_ctl stop -m immediate: connections cut and refused), "+
		"stall (SIGSTOP of every server process: connections accepted and never answered), refuse (ALLOW_CONNECTIONS false and sessions ended: a server error, SQLSTATE 55000); "+
		"a consumer is killed a second into each outage, so one starts while the database is unavailable")
	fs.IntVar(&o.redisOutages, "redis-outages", 0, "with N > 0, the dedup modes' private Redis is SIGKILLed and kept down for --redis-outage-duration N times mid-run, per mode")
	fs.DurationVar(&o.redisOutageDur, "redis-outage-duration", 5*time.Second, "how long each --redis-outages outage lasts")
	fs.IntVar(&o.freezes, "freezes", 0, "consumers frozen mid-backlog, per mode: the demo sends a running consumer SIGUSR1, it stops itself (SIGSTOP) at its next in-handler point (effect written, transaction open, dedup lease held), and the demo sends SIGCONT after --freeze-duration; one that reaches no handler within 4s is SIGSTOPped where it is")
	fs.DurationVar(&o.freezeDur, "freeze-duration", 5*time.Second, "how long each --freezes freeze lasts (the consumers' dedup lease is "+consumerLease.String()+")")
	fs.Float64Var(&o.failRate, "fail-rate", 0, "fraction of transfers whose handler fails with an ordinary error on their first one or two attempts (half each, chosen by a hash of the message ID), after the transfer was written and before it commits: "+
		"they go through the quick retries and the retry queues (200ms, 1s); a broker restart waits until some are waiting there")
	fs.DurationVar(&o.timeout, "timeout", 100*time.Second, "time allowed per mode")
	fs.StringVar(&o.queueType, "queue-type", "quorum", "quorum | classic")
	fs.StringVar(&o.jsonOut, "json", "", "also write the ledgers as JSON to this file")
	fs.StringVar(&o.amqpURLs, "amqp-urls", "", "comma-separated AMQP URLs of a cluster's nodes: the publisher and the consumers fail over between them (the demo's own bookkeeping uses the first)")
	fs.StringVar(&o.sentinels, "redis-sentinels", "", "comma-separated Redis Sentinel addresses: the dedup modes' store goes through them")
	fs.StringVar(&o.master, "redis-master", "idemq", "the primary's name the Sentinels monitor")
	fs.StringVar(&o.redisCluster, "redis-cluster", "", "comma-separated Redis Cluster seed nodes: the dedup modes' store goes through them")
	fs.StringVar(clusterFaults, "cluster-faults", "", "comma-separated faults of the cluster, injected in order as the consumers progress, per mode: "+
		"leader-kill (kill -9 the node leading the queue, restart it), rolling (restart the nodes one at a time), "+
		"outage (stop a node for 20s, longer than the consumers' reconnect backoff), redis-failover (kill -9 the Redis primary behind the Sentinels; dedup modes only), "+
		"redis-cluster-kill (kill -9 a Redis Cluster primary, wait for its replica to take over, restart it; dedup modes only)")
	fs.StringVar(&o.clusterScript, "cluster-script", "scripts/cluster.sh", "the script that runs the cluster's faults")
	return fs
}

func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 1)
	signalNotify(ch)
	go func() {
		select {
		case <-ch:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
