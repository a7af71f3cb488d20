package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/topology"
)

type demoOpts struct {
	amqpURL, pgURL, redisURL string
	// A cluster (make cluster-chaos): the nodes' URLs and the Redis
	// Sentinels, comma-separated, the primary's name, and the faults
	// scripts/cluster.sh injects mid-run, in order.
	amqpURLs, sentinels, master string
	clusterFaults               []string
	clusterScript               string
	messages, kills, cuts       int
	consumers                   int
	resendPct                   int
	crashRate                   float64
	modes                       []string
	timeout                     time.Duration
	queueType                   string
	jsonOut                     string
	redisRestarts, proxyCuts    int
	brokerRestarts              int
	// Dependency outages: the mode's PostgreSQL (a private server of the
	// demo's, pg) and the dedup modes' private Redis are stopped for a
	// while during the backlog.
	dbOutages, redisOutages     int
	dbOutageDur, redisOutageDur time.Duration
	pg                          *privatePostgres
	// Freezes: a running consumer is stopped (SIGSTOP) mid-handler for
	// freezeDur, then continued (SIGCONT).
	freezes   int
	freezeDur time.Duration
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

func demoMain(args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	var o demoOpts
	var modes string
	fs.StringVar(&o.amqpURL, "amqp", envOr("IDEMQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "AMQP URL")
	fs.StringVar(&o.pgURL, "postgres", envOr("IDEMQ_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "PostgreSQL URL (a database per mode is created next to it)")
	fs.StringVar(&o.redisURL, "redis", envOr("IDEMQ_REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis URL")
	fs.IntVar(&o.messages, "messages", 2000, "unique transfers per mode")
	fs.IntVar(&o.kills, "kills", 3, "consumers SIGKILLed at random moments, per mode")
	fs.IntVar(&o.cuts, "cuts", 1, "broker connection cuts (rabbitmqctl close_all_connections), per mode")
	fs.IntVar(&o.consumers, "consumers", 2, "consumer processes")
	fs.IntVar(&o.resendPct, "resend", 10, "percent of transfers the publisher sends twice (same message ID)")
	fs.Float64Var(&o.crashRate, "crash-rate", 0.002, "per-delivery probability of a consumer SIGKILLing itself at each crash point (before claim, in handler, after commit, before ack)")
	fs.StringVar(&modes, "modes", "", "modes to run, of none,dedup,dedup-nopersist,inbox (default none,dedup,inbox, plus dedup-nopersist when --redis-restarts > 0)")
	fs.IntVar(&o.redisRestarts, "redis-restarts", -1, "with N > 0, the dedup modes use a private redis-server (dedup: --appendonly yes --appendfsync always; dedup-nopersist: no persistence) that is SIGKILLed and restarted N times mid-run; 0: dedup uses the shared Redis; -1: as many as --cuts")
	fs.IntVar(&o.proxyCuts, "proxy-cuts", -1, "consumers reach the broker through a TCP proxy of the demo's that cuts all their connections N times mid-run, per mode (0: no proxy; -1: as many as --cuts)")
	fs.IntVar(&o.brokerRestarts, "broker-restarts", 0, "restarts of the broker (rabbitmqctl stop_app, start_app) mid-run, per mode: every client of the broker sees them")
	fs.IntVar(&o.dbOutages, "db-outages", 0, "with N > 0, the demo runs a private PostgreSQL of its own (initdb) and stops it (pg_ctl stop -m immediate) for --db-outage-duration N times mid-run, per mode")
	fs.DurationVar(&o.dbOutageDur, "db-outage-duration", 5*time.Second, "how long each --db-outages outage lasts")
	fs.IntVar(&o.redisOutages, "redis-outages", 0, "with N > 0, the dedup modes' private Redis is SIGKILLed and kept down for --redis-outage-duration N times mid-run, per mode")
	fs.DurationVar(&o.redisOutageDur, "redis-outage-duration", 5*time.Second, "how long each --redis-outages outage lasts")
	fs.IntVar(&o.freezes, "freezes", 0, "consumers frozen mid-backlog, per mode: the demo sends a running consumer SIGUSR1, it stops itself (SIGSTOP) at its next in-handler point (effect written, transaction open, dedup lease held), and the demo sends SIGCONT after --freeze-duration; one that reaches no handler within 4s is SIGSTOPped where it is")
	fs.DurationVar(&o.freezeDur, "freeze-duration", 5*time.Second, "how long each --freezes freeze lasts (the consumers' dedup lease is "+consumerLease.String()+")")
	fs.DurationVar(&o.timeout, "timeout", 100*time.Second, "time allowed per mode")
	fs.StringVar(&o.queueType, "queue-type", "quorum", "quorum | classic")
	fs.StringVar(&o.jsonOut, "json", "", "also write the ledgers as JSON to this file")
	fs.StringVar(&o.amqpURLs, "amqp-urls", "", "comma-separated AMQP URLs of a cluster's nodes: the publisher and the consumers fail over between them (the demo's own bookkeeping uses the first)")
	fs.StringVar(&o.sentinels, "redis-sentinels", "", "comma-separated Redis Sentinel addresses: the dedup modes' store goes through them")
	fs.StringVar(&o.master, "redis-master", "idemq", "the primary's name the Sentinels monitor")
	var clusterFaults string
	fs.StringVar(&clusterFaults, "cluster-faults", "", "comma-separated faults of the cluster, injected in order as the consumers progress, per mode: "+
		"leader-kill (kill -9 the node leading the queue, restart it), rolling (restart the nodes one at a time), "+
		"outage (stop a node for 20s, longer than the consumers' reconnect backoff), redis-failover (kill -9 the Redis primary; dedup modes only)")
	fs.StringVar(&o.clusterScript, "cluster-script", "scripts/cluster.sh", "the script that runs the cluster's faults")
	if err := fs.Parse(args); err != nil {
		return err
	}
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	if urls := splitList(o.amqpURLs); len(urls) > 0 && !explicit["amqp"] {
		o.amqpURL = urls[0]
	}
	for _, f := range splitList(clusterFaults) {
		switch f {
		case "leader-kill", "rolling", "outage", "redis-failover":
			o.clusterFaults = append(o.clusterFaults, f)
		default:
			return fmt.Errorf("--cluster-faults: unknown fault %q", f)
		}
	}
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
	fmt.Printf("idemq bank demo: %d transfers per mode (+%d%% resent with the same ID, +%d malformed), %d consumer processes,\n",
		o.messages, o.resendPct, len(badMessages()), o.consumers)
	fmt.Printf("%d kill -9 per mode + self-kills at every crash point (rate %.3f), %d broker connection cut(s),\n",
		o.kills, o.crashRate, o.cuts)
	fmt.Printf("%d proxy cut(s) of every consumer connection, %d kill -9 + restart(s) of the dedup modes' private Redis,\n",
		o.proxyCuts, o.redisRestarts)
	fmt.Printf("%d broker restart(s), %d PostgreSQL outage(s) of %v, %d Redis outage(s) of %v,\n",
		o.brokerRestarts, o.dbOutages, o.dbOutageDur, o.redisOutages, o.redisOutageDur)
	fmt.Printf("%d consumer freeze(s) (SIGSTOP mid-handler) of %v (dedup lease %v).\n\n", o.freezes, o.freezeDur, consumerLease)
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
	for _, l := range ledgers {
		if l.mode == modeInbox && !l.exact() {
			return errors.New("inbox mode was not exact: this is a bug")
		}
		if len(o.clusterFaults) > 0 && l.lost > 0 {
			return fmt.Errorf("mode %s lost %d transfers through the cluster faults", l.mode, l.lost)
		}
	}
	return nil
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

type ledger struct {
	mode                            string
	published, unique, bad          int
	deliveries, redeliveries, dups  int64
	applied, twice, lost            int
	expected, actual                int64
	deadLettered                    int
	reasons                         map[string]int
	kills, crashes, cuts, restarted int
	reconnects, storeErrors         int64
	// redis is the dedup store: "-" (none), "shared", or a private server's
	// variant ("aof-always", "no-persist").
	redis                    string
	redisRestarts, redisKept int
	proxyCuts, proxyConns    int
	brokerRestarts           int
	// stuck counts consumers that did not exit within stopGrace of SIGTERM.
	stuck int
	// dbOutages and redisOutages count the dependency outages that ran;
	// validDead the valid transfers found in the DLQ (must be 0).
	dbOutages, redisOutages int
	validDead               int
	outagesSeen             int64
	// freezes counts the consumers frozen (SIGSTOP, then SIGCONT);
	// freezesMid those that stopped themselves in a handler (effect
	// written, transaction open, dedup lease held); freezeLeasesLost the
	// leases_lost the frozen consumers reported after their thaw.
	freezes, freezesMid int
	freezeLeasesLost    int64
}

// Ledger is the JSON form of one mode's results (bank demo --json).
type Ledger struct {
	Mode         string         `json:"mode"`
	Published    int            `json:"published"`
	Unique       int            `json:"unique"`
	Malformed    int            `json:"malformed"`
	Deliveries   int64          `json:"deliveries"`
	Redeliveries int64          `json:"redeliveries"`
	Duplicates   int64          `json:"duplicates_suppressed"`
	Applied      int            `json:"applied"`
	AppliedTwice int            `json:"applied_twice"`
	Lost         int            `json:"lost"`
	Expected     int64          `json:"expected_total"`
	Actual       int64          `json:"actual_total"`
	DeadLettered int            `json:"dead_lettered"`
	Reasons      map[string]int `json:"dead_letter_reasons"`
	Kills        int            `json:"kills"`
	Crashes      int            `json:"crashes"`
	Cuts         int            `json:"connection_cuts"`
	Exact        bool           `json:"exact"`
	// Redis is the dedup store: "-" (no dedup store), "shared", "aof-always"
	// (private, --appendonly yes --appendfsync always) or "no-persist"
	// (private, no AOF, no snapshots).
	Redis         string `json:"redis"`
	RedisRestarts int    `json:"redis_restarts"`
	// RedisKept counts the restarts after which a key written just before
	// the kill was still there.
	RedisKept      int   `json:"redis_restarts_data_kept"`
	BrokerRestarts int   `json:"broker_restarts"`
	ProxyCuts      int   `json:"proxy_cuts"`
	ProxyConns     int   `json:"proxy_connections_cut"`
	Reconnects     int64 `json:"consumer_reconnects"`
	StoreErrors    int64 `json:"dedup_store_errors"`
	// StuckOnSigterm counts consumers still running a minute after SIGTERM
	// (then SIGQUIT for a goroutine dump in their log, then SIGKILL).
	StuckOnSigterm int `json:"stuck_on_sigterm"`
	// DBOutages and RedisOutages count the dependency outages injected;
	// ValidDeadLettered the valid transfers dead-lettered (a dependency
	// outage is not the message's fault: must be 0); OutagesSeen the
	// consumers' breaker pauses (dependency_outages, summed).
	DBOutages         int   `json:"db_outages"`
	RedisOutages      int   `json:"redis_outages"`
	ValidDeadLettered int   `json:"valid_dead_lettered"`
	OutagesSeen       int64 `json:"consumer_pauses"`
	// Freezes counts the consumers frozen (SIGSTOP for --freeze-duration,
	// then SIGCONT); FreezesMidHandler those frozen in a handler (effect
	// written, transaction open, dedup lease held); FreezeLeasesLost the
	// increase of the frozen consumers' leases_lost seen after their thaw
	// (dedup modes; other lease losses of theirs at that time included).
	Freezes           int   `json:"freezes"`
	FreezesMidHandler int   `json:"freezes_mid_handler"`
	FreezeLeasesLost  int64 `json:"freeze_leases_lost"`
}

func writeLedgers(path string, ls []*ledger) error {
	var out []Ledger
	for _, l := range ls {
		out = append(out, Ledger{Mode: l.mode, Published: l.published, Unique: l.unique, Malformed: l.bad,
			Deliveries: l.deliveries, Redeliveries: l.redeliveries, Duplicates: l.dups, Applied: l.applied,
			AppliedTwice: l.twice, Lost: l.lost, Expected: l.expected, Actual: l.actual, DeadLettered: l.deadLettered,
			Reasons: l.reasons, Kills: l.kills, Crashes: l.crashes, Cuts: l.cuts, Exact: l.exact(),
			Redis: l.redis, RedisRestarts: l.redisRestarts, RedisKept: l.redisKept, ProxyCuts: l.proxyCuts, BrokerRestarts: l.brokerRestarts,
			ProxyConns: l.proxyConns, Reconnects: l.reconnects, StoreErrors: l.storeErrors, StuckOnSigterm: l.stuck,
			DBOutages: l.dbOutages, RedisOutages: l.redisOutages, ValidDeadLettered: l.validDead, OutagesSeen: l.outagesSeen,
			Freezes: l.freezes, FreezesMidHandler: l.freezesMid, FreezeLeasesLost: l.freezeLeasesLost})
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func (l *ledger) exact() bool {
	// A consumer killed between publishing a dead letter and acking the
	// original dead-letters it again on redelivery: duplicated dead letters
	// are allowed, missing ones are not.
	return l.lost == 0 && l.twice == 0 && l.expected == l.actual && l.deadLettered >= l.bad && l.validDead == 0
}

// badMessages are the malformed transfers every mode must dead-letter.
func badMessages() []amqp.Publishing {
	return []amqp.Publishing{
		{Body: []byte(`{"account":"acc-1","amount":5}`)},                            // no message_id
		{MessageId: "bad-json", Body: []byte(`{"account":`)},                        // not JSON
		{MessageId: "bad-account", Body: []byte(`{"amount":5}`)},                    // no account
		{MessageId: "bad-float", Body: []byte(`{"account":"acc-1","amount":1.5}`)},  // not an integer
		{MessageId: "bad-string", Body: []byte(`{"account":"acc-1","amount":"5"}`)}, // not a number
		{MessageId: "bad\x01ctl", Body: []byte(`{"account":"acc-1","amount":5}`)},   // control character in the ID
	}
}

func modeDB(ctx context.Context, base, name string) (string, func(), error) {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", nil, fmt.Errorf("postgres: %w", err)
	}
	defer conn.Close(ctx)
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", nil, fmt.Errorf("create database: %w", err)
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	drop := func() {
		c, err := pgx.Connect(context.Background(), base)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
	}
	return u.String(), drop, nil
}

func runMode(ctx context.Context, o demoOpts, mode string) (*ledger, error) {
	suffix := idemq.NewMessageID()[28:]
	queue := fmt.Sprintf("bank.demo.%s.%s", mode, suffix)
	dbURL, drop, err := modeDB(ctx, o.pgURL, "bank_demo_"+strings.ReplaceAll(mode, "-", "_")+"_"+suffix)
	if err != nil {
		return nil, err
	}
	defer drop()
	dir, err := os.MkdirTemp("", "bank-demo-")
	if err != nil {
		return nil, err
	}
	// The children's logs are kept when one of them hung on SIGTERM: its
	// goroutine dump is in there.
	var l *ledger
	defer func() {
		if l != nil && l.stuck > 0 {
			fmt.Fprintf(os.Stderr, "%s: consumer logs kept in %s\n", mode, dir)
			return
		}
		os.RemoveAll(dir)
	}()
	q := bankQueue(queue, o.queueType)
	topo := topology.Topology{Queues: []topology.Queue{q}}
	defer deleteQueues(o.amqpURL, topology.ForQueue(q))

	l = &ledger{mode: mode, reasons: map[string]int{}, redis: "-"}
	// co is what the crash-prone consumers get: the proxy's URL and the
	// mode's Redis. The publisher, the final clean consumer and the demo's
	// own bookkeeping go to the broker directly.
	co := o
	var events []faultEvent
	// The first dependency outage of the mode calls outageStarted; the
	// publisher holds the second half of the transfers until then, so the
	// outage always meets a backlog (the case that dead-lettered valid
	// transfers), whatever the speeds.
	outageSignal := make(chan struct{})
	var outageOnce sync.Once
	outageStarted := func() { outageOnce.Do(func() { close(outageSignal) }) }
	holdForOutage := o.pg != nil || (o.redisOutages > 0 && (mode == modeDedup || mode == modeDedupNoPersist))
	if o.proxyCuts > 0 {
		u, err := url.Parse(o.amqpURL)
		if err != nil {
			return nil, fmt.Errorf("amqp URL: %w", err)
		}
		px, err := startProxy(u.Host)
		if err != nil {
			return nil, err
		}
		defer px.close()
		if co.amqpURL, err = px.proxyURL(o.amqpURL); err != nil {
			return nil, err
		}
		for k := 1; k <= o.proxyCuts; k++ {
			events = append(events, faultEvent{at: (2*k - 1) * o.messages / (2 * (o.proxyCuts + 1)), fire: func(ctx context.Context) error {
				l.proxyCuts++
				l.proxyConns += px.cut(ctx, 5*time.Second)
				return nil
			}})
		}
	}
	for k := 1; k <= o.brokerRestarts; k++ {
		// Between the proxy cuts and the Redis restarts.
		events = append(events, faultEvent{at: (4*k - 1) * o.messages / (4 * (o.brokerRestarts + 1)), fire: func(ctx context.Context) error {
			if err := restartBroker(ctx); err != nil {
				return err
			}
			l.brokerRestarts++
			return nil
		}})
	}
	// Cluster faults: fault k fires once the consumers applied k/(F+1) of
	// the transfers; the publisher holds half a step later until it has
	// started, so every fault meets a backlog and publishes go on during it.
	var faults []string
	for _, f := range o.clusterFaults {
		if f != "redis-failover" || mode == modeDedup || mode == modeDedupNoPersist {
			faults = append(faults, f)
		}
	}
	clusterHold := map[int]chan struct{}{}
	for k, f := range faults {
		started := make(chan struct{})
		step := o.messages / (len(faults) + 1)
		clusterHold[(k+1)*step+step/2] = started
		events = append(events, faultEvent{at: (k + 1) * step, fire: func(ctx context.Context) error {
			return clusterFault(ctx, o.clusterScript, f, queue, started)
		}})
	}
	switch {
	case (mode == modeDedup || mode == modeDedupNoPersist) && o.sentinels != "":
		l.redis = "sentinel"
	case mode == modeDedup && o.redisRestarts == 0 && o.redisOutages == 0:
		l.redis = "shared"
	case mode == modeDedup || mode == modeDedupNoPersist:
		rs, err := startPrivateRedis(ctx, dir, mode == modeDedup)
		if err != nil {
			return nil, err
		}
		defer rs.stop()
		l.redis = rs.variant()
		co.redisURL = rs.url()
		for k := 1; k <= o.redisRestarts; k++ {
			events = append(events, faultEvent{at: k * o.messages / (o.redisRestarts + 1), fire: func(ctx context.Context) error {
				kept, err := rs.restart(ctx)
				if err != nil {
					return err
				}
				l.redisRestarts++
				if kept {
					l.redisKept++
				}
				return nil
			}})
		}
		for k := 1; k <= o.redisOutages; k++ {
			// Between the restarts: a Redis down for seconds under a backlog.
			events = append(events, faultEvent{at: (2*k - 1) * o.messages / (2 * (o.redisOutages + 1)), fire: func(ctx context.Context) error {
				if err := rs.outage(ctx, o.redisOutageDur, outageStarted); err != nil {
					return err
				}
				l.redisOutages++
				return nil
			}})
		}
	}
	if o.pg != nil {
		for k := 1; k <= o.dbOutages; k++ {
			events = append(events, faultEvent{at: (3*k - 1) * o.messages / (3 * (o.dbOutages + 1)), fire: func(ctx context.Context) error {
				if err := o.pg.outage(ctx, o.dbOutageDur, outageStarted); err != nil {
					return err
				}
				l.dbOutages++
				return nil
			}})
		}
	}

	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()

	sup := newSupervisor("crashy", co, mode, queue, dbURL, dir)
	// The freezes run on the fault goroutine: a rand of their own.
	freezeRng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	// Freeze k fires at a progress point below k/(freezes+1) of the
	// transfers, and the publisher holds there until the freeze has armed
	// its consumer: whatever the speeds, transfers keep coming while the
	// armed consumer waits for a handler to stop in.
	freezeArmed := make(map[int]chan struct{})
	for k := 1; k <= o.freezes; k++ {
		armed := make(chan struct{})
		var once sync.Once
		freezeArmed[k*o.messages/(o.freezes+1)] = armed
		events = append(events, faultEvent{at: (5*k - 2) * o.messages / (5 * (o.freezes + 1)), fire: func(ctx context.Context) error {
			defer once.Do(func() { close(armed) })
			fr := sup.freezeOne(ctx, freezeRng, o.freezeDur, consumerMode(mode) == modeDedup, func() { once.Do(func() { close(armed) }) })
			if fr.frozen {
				l.freezes++
			}
			if fr.midHandler {
				l.freezesMid++
			}
			l.freezeLeasesLost += fr.leasesLost
			return nil
		}})
	}
	sup.start(o.consumers)
	// The proxy cuts and Redis restarts fire as the consumers progress, so
	// they hit the run in the middle whatever the publishing speed.
	faultCtx, stopFaults := context.WithCancel(ctx)
	defer stopFaults()
	faultsDone := make(chan error, 1)
	go func() { faultsDone <- runAtProgress(faultCtx, pool, events) }()
	faultsFinished, faultErr := false, error(nil)
	waitFaults := func(block bool) {
		if faultsFinished {
			return
		}
		if block {
			stopFaults()
			faultErr = <-faultsDone
			faultsFinished = true
			return
		}
		select {
		case faultErr = <-faultsDone:
			faultsFinished = true
		default:
		}
	}

	// Publish while the consumers work and get killed.
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: o.amqpURL, URLs: splitList(o.amqpURLs), Setup: topology.SetupFunc(topo)})
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	var expected int64
	pubCtx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	killEvery := o.messages / (o.kills + 1)
	cutAt := map[int]bool{}
	for i := 1; i <= o.cuts; i++ {
		cutAt[i*o.messages/(o.cuts+1)+killEvery/2] = true
	}
	for i := 0; i < o.messages; i++ {
		if holdForOutage && i == o.messages/2 {
			select {
			case <-outageSignal:
			case <-pubCtx.Done():
			case <-time.After(o.timeout / 2):
				fmt.Fprintf(os.Stderr, "(no dependency outage started within %v; publishing on) ", o.timeout/2)
			}
		}
		if started, ok := clusterHold[i]; ok {
			select {
			case <-started:
			case <-pubCtx.Done():
			}
		}
		if armed, ok := freezeArmed[i]; ok {
			select {
			case <-armed:
			case <-pubCtx.Done():
			case <-time.After(o.timeout / 2):
				fmt.Fprintf(os.Stderr, "(no freeze armed within %v; publishing on) ", o.timeout/2)
			}
		}
		id := fmt.Sprintf("t-%s-%d", suffix, i)
		amount := int64(1 + rng.IntN(100))
		expected += amount
		body, _ := json.Marshal(transfer{Account: fmt.Sprintf("acc-%d", rng.IntN(20)), Amount: amount})
		times := 1
		if rng.IntN(100) < o.resendPct {
			times = 2 // the publisher resends: same ID, same body
		}
		for k := 0; k < times; k++ {
			if err := pub.Publish(pubCtx, idemq.Message{ID: id, RoutingKey: queue, Body: body, ContentType: "application/json"}); err != nil {
				return nil, fmt.Errorf("publish: %w", err)
			}
			l.published++
		}
		if killEvery > 0 && i > 0 && i%killEvery == 0 && l.kills < o.kills {
			if sup.killOne(rng) {
				l.kills++
			}
		}
		if cutAt[i] {
			if err := rabbitmqctl(ctx, "close_all_connections", "bank demo: connection cut"); err == nil {
				l.cuts++
			} else {
				fmt.Fprintf(os.Stderr, "(connection cut skipped: %v) ", err)
			}
		}
	}
	if err := rawPublish(pubCtx, o.amqpURL, queue, badMessages()); err != nil {
		return nil, err
	}
	l.published += len(badMessages())
	l.bad = len(badMessages())
	l.unique = o.messages
	l.expected = expected

	// Wait until every transfer was applied at least once, every bad one
	// dead-lettered and every fault fired (or the time is up: then what is
	// missing is "lost", and the faults that did not fire are not counted).
	deadline := time.Now().Add(o.timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		waitFaults(false)
		if faultErr != nil {
			break
		}
		applied, _ := distinctApplied(ctx, pool)
		dl, _ := queueDepth(o.amqpURL, q.Name+".dlq")
		if applied >= o.messages && dl >= l.bad && faultsFinished {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitFaults(true)
	if faultErr != nil && !errors.Is(faultErr, context.Canceled) {
		sup.stopAll()
		return nil, fmt.Errorf("fault injection: %w", faultErr)
	}
	// Let the crash-prone consumers go, and finish with one clean consumer
	// so that everything still queued (redeliveries after a kill) is seen.
	sup.stopAll()
	final := newSupervisor("final", demoOpts{amqpURL: o.amqpURL, redisURL: co.redisURL, queueType: o.queueType,
		amqpURLs: o.amqpURLs, sentinels: o.sentinels, master: o.master}, mode, queue, dbURL, dir)
	final.start(1)
	quiet := time.Now().Add(o.timeout / 4)
	for time.Now().Before(quiet) && ctx.Err() == nil {
		depth, _ := queueDepth(o.amqpURL, queue)
		if depth == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	final.stopAll() // SIGTERM: finishes in-flight work and acks it
	l.crashes = sup.crashes()
	l.restarted = sup.restarts()
	l.stuck = sup.stuck() + final.stuck()
	for _, s := range append(sup.stats(), final.stats()...) {
		l.deliveries += s[idemq.CountDelivered]
		l.redeliveries += s[idemq.CountRedelivered]
		l.dups += s[idemq.CountDuplicates]
		l.reconnects += s[idemq.CountReconnects]
		l.storeErrors += s[idemq.CountStoreErrors]
		l.outagesSeen += s[idemq.CountDependencyOutages]
	}

	counts, err := appliedCounts(ctx, pool)
	if err != nil {
		return nil, err
	}
	for i := 0; i < o.messages; i++ {
		switch n := counts[fmt.Sprintf("t-%s-%d", suffix, i)]; {
		case n == 0:
			l.lost++
		case n > 1:
			l.twice++
		}
		if counts[fmt.Sprintf("t-%s-%d", suffix, i)] > 0 {
			l.applied++
		}
	}
	if err := pool.QueryRow(ctx, `SELECT COALESCE(SUM(balance),0) FROM accounts`).Scan(&l.actual); err != nil {
		return nil, err
	}
	dls, ids, err := drainReasons(o.amqpURL, q.Name+".dlq")
	if err != nil {
		return nil, err
	}
	for i, r := range dls {
		l.deadLettered++
		l.reasons[r]++
		if strings.HasPrefix(ids[i], "t-"+suffix+"-") {
			l.validDead++
		}
	}
	return l, nil
}

// restartBroker stops and starts the RabbitMQ application on the local
// node: every connection drops, queues and persistent messages survive.
func restartBroker(ctx context.Context) error {
	for _, cmd := range []string{"stop_app", "start_app"} {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := rabbitmqctl(cctx, cmd)
		cancel()
		if err != nil {
			return fmt.Errorf("broker restart: %w", err)
		}
	}
	return nil
}

// rabbitmqctl runs rabbitmqctl args on the demo's node
// (IDEMQ_RABBITMQ_NODE); its output is in the error.
func rabbitmqctl(ctx context.Context, args ...string) error {
	full := append([]string{"-q", "-n", envOr("IDEMQ_RABBITMQ_NODE", "rabbit@localhost")}, args...)
	out, err := exec.CommandContext(ctx, "rabbitmqctl", full...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// faultEvent is a fault to inject once the consumers have written at least
// at rows to bank_applied.
type faultEvent struct {
	at   int
	fire func(ctx context.Context) error
}

// runAtProgress fires the events in the order of their at, each as soon as
// bank_applied holds that many rows (resends and duplicates included: it is
// a progress clock, not a count of transfers). It returns nil when every
// event fired, the first error of an event, or ctx's error.
func runAtProgress(ctx context.Context, pool *pgxpool.Pool, events []faultEvent) error {
	sort.SliceStable(events, func(i, j int) bool { return events[i].at < events[j].at })
	for _, ev := range events {
		for {
			var n int
			// Before the first consumer created the table this fails: 0.
			_ = pool.QueryRow(ctx, `SELECT count(*) FROM bank_applied`).Scan(&n)
			if n >= ev.at {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		// A fault that started finishes: a Redis left dead would stall the run.
		if err := ev.fire(context.WithoutCancel(ctx)); err != nil {
			return err
		}
	}
	return nil
}

func distinctApplied(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `SELECT count(DISTINCT message_id) FROM bank_applied`).Scan(&n)
	return n, err
}

func appliedCounts(ctx context.Context, pool *pgxpool.Pool) (map[string]int, error) {
	rows, err := pool.Query(ctx, `SELECT message_id, count(*) FROM bank_applied GROUP BY message_id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, rows.Err()
}

// rawPublish publishes msgs persistent, mandatory and confirmed,
// reconnecting until ctx ends (a broker restart may be in progress). A
// message whose confirm was lost with its connection is sent again: a
// malformed message may be dead-lettered twice, never not at all.
func rawPublish(ctx context.Context, amqpURL, queue string, msgs []amqp.Publishing) error {
	sent := 0
	for {
		n, err := rawPublishOnce(ctx, amqpURL, queue, msgs[sent:])
		sent += n
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("publish malformed messages: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// rawPublishOnce publishes msgs on one connection and returns how many
// were confirmed (and not returned) before the first failure.
func rawPublishOnce(ctx context.Context, amqpURL, queue string, msgs []amqp.Publishing) (int, error) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	if err := ch.Confirm(false); err != nil {
		return 0, err
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, len(msgs)))
	for i, m := range msgs {
		m.DeliveryMode = amqp.Persistent
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, m)
		if err != nil {
			return i, err
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return i, fmt.Errorf("malformed message not confirmed (nack or %v)", err)
		}
		select {
		case r := <-returns: // sent before the confirm: unroutable
			return i, fmt.Errorf("malformed message returned: %s", r.ReplyText)
		default:
		}
	}
	return len(msgs), nil
}

// queueDepth is the number of ready messages (a passive declare).
func queueDepth(amqpURL, queue string) (int, error) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return q.Messages, nil
}

// drainReasons takes every dead letter and returns their reasons and
// message IDs.
func drainReasons(amqpURL, queue string) ([]string, []string, error) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, err
	}
	var out, ids []string
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			return out, ids, nil
		}
		ids = append(ids, d.MessageId)
		r, _ := d.Headers[idemq.HeaderReason].(string)
		if r == "" {
			r = "?"
		}
		out = append(out, r)
	}
}

func deleteQueues(amqpURL string, p topology.Plan) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return
	}
	defer conn.Close()
	names := []string{p.Queue, p.DLQ}
	for _, r := range p.Retries {
		names = append(names, r.Name)
	}
	for _, n := range names {
		if n == "" {
			continue
		}
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(n, false, false, false)
			_ = ch.Close()
		}
	}
}

// supervisor keeps N `bank consume` child processes running, restarting the
// ones that die (SIGKILL from the demo or from a crash hook).
type supervisor struct {
	o                      demoOpts
	mode, queue, db, dir   string
	mu                     sync.Mutex
	procs                  map[int]*exec.Cmd
	statsOf                map[int]string // slot → its running child's stats file
	statFiles              []string
	stopping               atomic.Bool
	wg                     sync.WaitGroup
	crashN, restartN, seqN atomic.Int64
	stuckN                 atomic.Int64
	name                   string // names its children's log and stats files
}

func newSupervisor(name string, o demoOpts, mode, queue, db, dir string) *supervisor {
	return &supervisor{name: name, o: o, mode: mode, queue: queue, db: db, dir: dir, procs: map[int]*exec.Cmd{}, statsOf: map[int]string{}}
}

func (s *supervisor) start(n int) {
	for slot := 0; slot < n; slot++ {
		s.wg.Add(1)
		go s.run(slot)
	}
}

func (s *supervisor) run(slot int) {
	defer s.wg.Done()
	self, _ := os.Executable()
	for first := true; !s.stopping.Load(); first = false {
		if !first {
			s.restartN.Add(1)
		}
		seq := s.seqN.Add(1)
		stats := filepath.Join(s.dir, fmt.Sprintf("stats-%s-%d.json", s.name, seq))
		cmd := exec.Command(self, "consume", "--mode", consumerMode(s.mode), "--queue", s.queue, "--queue-type", s.o.queueType,
			"--amqp", s.o.amqpURL, "--postgres", s.db, "--redis", s.o.redisURL, "--stats", stats,
			"--lease", consumerLease.String(), "--workers", "4", "--prefetch", "50")
		if s.o.amqpURLs != "" {
			cmd.Args = append(cmd.Args, "--amqp-urls", s.o.amqpURLs)
		}
		if s.o.sentinels != "" {
			cmd.Args = append(cmd.Args, "--redis-sentinels", s.o.sentinels, "--redis-master", s.o.master)
		}
		cmd.Env = os.Environ()
		if s.o.crashRate > 0 {
			cmd.Env = append(cmd.Env, "IDEMQ_BANK_CRASH=before-claim,in-handler,after-commit,before-ack",
				fmt.Sprintf("IDEMQ_BANK_CRASH_RATE=%g", s.o.crashRate))
		}
		if s.o.freezes > 0 {
			cmd.Env = append(cmd.Env, "IDEMQ_BANK_FREEZE=1") // SIGUSR1 arms a freeze
		}
		logf, _ := os.Create(filepath.Join(s.dir, fmt.Sprintf("consumer-%s-%d.log", s.name, seq)))
		cmd.Stdout, cmd.Stderr = logf, logf
		setPdeathsig(cmd)
		// Start and register under mu, checking stopping there too: stopAll
		// sets stopping under mu, so a child is either started before it
		// (and gets its SIGTERM) or not at all. Without this a child started
		// just as stopAll ran got no signal and stopAll waited for ever.
		s.mu.Lock()
		if s.stopping.Load() {
			s.mu.Unlock()
			logf.Close()
			return
		}
		if err := cmd.Start(); err != nil {
			s.mu.Unlock()
			fmt.Fprintln(os.Stderr, "start consumer:", err)
			logf.Close()
			time.Sleep(time.Second)
			continue
		}
		s.procs[slot] = cmd
		s.statsOf[slot] = stats
		s.statFiles = append(s.statFiles, stats)
		s.mu.Unlock()
		err := cmd.Wait()
		logf.Close()
		s.mu.Lock()
		delete(s.procs, slot)
		delete(s.statsOf, slot)
		s.mu.Unlock()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
				s.crashN.Add(1)
			} else if !s.stopping.Load() {
				b, _ := os.ReadFile(logf.Name())
				fmt.Fprintf(os.Stderr, "consumer exited: %v\n%s\n", err, tail(string(b), 800))
				time.Sleep(500 * time.Millisecond)
			}
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (s *supervisor) killOne(rng *rand.Rand) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	var slots []int
	for k := range s.procs {
		slots = append(slots, k)
	}
	if len(slots) == 0 {
		return false
	}
	sort.Ints(slots)
	cmd := s.procs[slots[rng.IntN(len(slots))]]
	return cmd.Process.Signal(syscall.SIGKILL) == nil
}

// stopGrace is how long a consumer has to exit after SIGTERM (its own
// ShutdownTimeout is 10 s) before stopAll takes it for hung.
const stopGrace = 60 * time.Second

// stopAll sends SIGTERM to every child and waits for them to exit. A child
// still running after stopGrace breaks the contract (SIGTERM: finish and
// exit 0): it gets SIGQUIT, so its goroutines are dumped into its log, then
// SIGKILL, and is counted in stuck.
func (s *supervisor) stopAll() {
	s.mu.Lock()
	s.stopping.Store(true)
	for _, cmd := range s.procs {
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(stopGrace):
	}
	s.mu.Lock()
	for slot, cmd := range s.procs {
		s.stuckN.Add(1)
		fmt.Fprintf(os.Stderr, "consumer %s/%d (pid %d) still running %v after SIGTERM: SIGQUIT, then SIGKILL\n",
			s.name, slot, cmd.Process.Pid, stopGrace)
		_ = cmd.Process.Signal(syscall.SIGQUIT)
	}
	s.mu.Unlock()
	select {
	case <-done:
		return
	case <-time.After(5 * time.Second):
	}
	s.mu.Lock()
	for _, cmd := range s.procs {
		_ = cmd.Process.Kill()
	}
	s.mu.Unlock()
	<-done
}

// stuck counts children that did not exit within stopGrace of SIGTERM.
func (s *supervisor) stuck() int { return int(s.stuckN.Load()) }

// crashes counts children that died of SIGKILL, whoever sent it; the
// demo's own kills are a subset.
func (s *supervisor) crashes() int  { return int(s.crashN.Load()) }
func (s *supervisor) restarts() int { return int(s.restartN.Load()) }

func (s *supervisor) stats() []map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]int64
	for _, f := range s.statFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		m := map[string]int64{}
		if json.Unmarshal(b, &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

func printLedgers(w io.Writer, ls []*ledger) {
	width := 12
	for _, l := range ls {
		width = max(width, len(l.mode)+1)
	}
	row := func(label string, f func(l *ledger) string) {
		fmt.Fprintf(w, "%-34s", label)
		for _, l := range ls {
			fmt.Fprintf(w, "%*s", width, f(l))
		}
		fmt.Fprintln(w)
	}
	itoa := func(n int64) string { return fmt.Sprint(n) }
	redisOnly := func(l *ledger, v string) string {
		if l.redis == "-" {
			return "-"
		}
		return v
	}
	row("", func(l *ledger) string { return l.mode })
	row("published (incl. resends, bad)", func(l *ledger) string { return itoa(int64(l.published)) })
	row("unique transfers", func(l *ledger) string { return itoa(int64(l.unique)) })
	row("deliveries seen by consumers (≈)", func(l *ledger) string { return itoa(l.deliveries) })
	row("  of which redeliveries", func(l *ledger) string { return itoa(l.redeliveries) })
	row("duplicates suppressed", func(l *ledger) string { return itoa(l.dups) })
	row("consumers killed (kill -9)", func(l *ledger) string { return itoa(int64(l.crashes)) })
	row("broker cuts / proxy cuts (conns)", func(l *ledger) string {
		return fmt.Sprintf("%d/%d (%d)", l.cuts, l.proxyCuts, l.proxyConns)
	})
	row("broker restarts (stop/start_app)", func(l *ledger) string { return itoa(int64(l.brokerRestarts)) })
	row("consumers frozen (SIGSTOP)", func(l *ledger) string { return itoa(int64(l.freezes)) })
	row("  in a handler / leases lost", func(l *ledger) string {
		return fmt.Sprintf("%d/%s", l.freezesMid, redisOnly(l, itoa(l.freezeLeasesLost)))
	})
	row("consumers stuck after SIGTERM", func(l *ledger) string { return itoa(int64(l.stuck)) })
	row("consumer reconnects (≈)", func(l *ledger) string { return itoa(l.reconnects) })
	row("dedup Redis", func(l *ledger) string { return l.redis })
	row("Redis kill -9+restart (data kept)", func(l *ledger) string {
		return redisOnly(l, fmt.Sprintf("%d (%d)", l.redisRestarts, l.redisKept))
	})
	row("dedup store errors (≈)", func(l *ledger) string { return redisOnly(l, itoa(l.storeErrors)) })
	row("PostgreSQL / Redis outages", func(l *ledger) string {
		return fmt.Sprintf("%d/%s", l.dbOutages, redisOnly(l, itoa(int64(l.redisOutages))))
	})
	row("consumer pauses (breaker) (≈)", func(l *ledger) string { return itoa(l.outagesSeen) })
	row("valid transfers dead-lettered", func(l *ledger) string { return itoa(int64(l.validDead)) })
	row("transfers applied", func(l *ledger) string { return itoa(int64(l.applied)) })
	row("transfers applied twice or more", func(l *ledger) string { return itoa(int64(l.twice)) })
	row("transfers lost", func(l *ledger) string { return itoa(int64(l.lost)) })
	row("expected total balance", func(l *ledger) string { return itoa(l.expected) })
	row("actual total balance", func(l *ledger) string { return itoa(l.actual) })
	row("dead-lettered (malformed: "+fmt.Sprint(len(badMessages()))+")", func(l *ledger) string { return itoa(int64(l.deadLettered)) })
	row("verdict", func(l *ledger) string {
		if l.exact() {
			return "EXACT"
		}
		return "WRONG"
	})
	fmt.Fprintln(w)
	for _, l := range ls {
		var rs []string
		for r, n := range l.reasons {
			rs = append(rs, fmt.Sprintf("%s×%d", r, n))
		}
		sort.Strings(rs)
		fmt.Fprintf(w, "%s: dead-letter reasons %s; %d consumer restarts\n", l.mode, strings.Join(rs, ", "), l.restarted)
	}
	fmt.Fprintln(w)
	explain := map[string]string{
		modeNone: `none            applies every redelivery and every resend: money is created.`,
		modeDedup: `dedup           suppresses resends and redeliveries; a consumer killed after its
                commit but before the dedup record is completed applies that
                transfer twice.`,
		modeDedupNoPersist: `dedup-nopersist the same against a Redis without persistence: each restart
                forgets every dedup record, and a redelivery or resend that
                straddles it applies twice. Nothing is lost.`,
		modeInbox: `inbox           records the message ID in the same transaction as the balance:
                exact.`,
	}
	for _, l := range ls {
		fmt.Fprintln(w, explain[l.mode])
		if l.mode == modeDedup && l.redis == "aof-always" {
			fmt.Fprintln(w, `                aof-always: its private Redis fsyncs every write to an
                append-only file, so a restart forgets nothing acknowledged.`)
		}
	}
	for _, l := range ls {
		if l.freezes > 0 {
			fmt.Fprintln(w, `
frozen          a consumer stopped (SIGSTOP) in a handler — effect written, not
                committed, dedup lease held — past its lease, then continued.
                dedup: the lease is lost, so the handler's context is
                cancelled and its last statement, a lease check, fails: it
                rolls back and gives the delivery back. A worker frozen with
                its COMMIT already sent applies a transfer twice only if
                another copy (resend, redelivery) ran meanwhile: the
                after-commit window, counted as a lost lease. Inbox stays
                exact: the frozen transaction holds the inbox row.`)
			break
		}
	}
}

// clusterFault runs one fault of --cluster-faults with the cluster's
// script; started is closed once the fault has begun (the node is down,
// the primary killed). It returns once the cluster is whole again.
func clusterFault(ctx context.Context, script, fault, queue string, started chan struct{}) error {
	defer func() {
		select {
		case <-started:
		default:
			close(started)
		}
	}()
	var args []string
	switch fault {
	case "leader-kill":
		args = []string{"kill-leader", queue, "2"}
	case "rolling":
		args = []string{"rolling"}
	case "outage":
		args = []string{"outage", "2", "20"}
	case "redis-failover":
		args = []string{"redis-failover"}
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, script, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cluster fault %s: %w", fault, err)
	}
	close(started)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("cluster fault %s: %w\n%s", fault, err, out.String())
	}
	fmt.Fprintf(os.Stderr, "(cluster fault %s done in %.0fs) ", fault, time.Since(start).Seconds())
	return nil
}
