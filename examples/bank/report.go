// One mode's results: the ledger the run fills in, its JSON form (Ledger,
// bank demo --json, parsed by the tests and make chaos) and the table
// printLedgers shows.

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

type ledger struct {
	mode                           string
	published, unique, bad         int
	deliveries, redeliveries, dups int64
	applied, twice, lost           int
	// late: transfers not applied by the deadline but still in a queue
	// of the mode (lateWhere: by queue); heldByBroker: messages those
	// queues held out of reach (a broker's dead-letter worker).
	late, heldByBroker              int
	lateWhere                       map[string]int
	expected, actual                int64
	deadLettered                    int
	reasons                         map[string]int
	kills, crashes, cuts, restarted int
	// exited counts consumers that exited by themselves (neither killed
	// nor stopped): each is a process an outage or a fault made give up.
	exited                  int
	reconnects, storeErrors int64
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
	// deadNotApplied: valid transfers dead-lettered and never applied
	// (counted in validDead, not in lost); validDeadSeen: the first few
	// valid dead letters, with their reason and error.
	deadNotApplied int
	validDeadSeen  []string
	outagesSeen    int64
	// freezes counts the consumers frozen (SIGSTOP, then SIGCONT);
	// freezesMid those that stopped themselves in a handler (effect
	// written, transaction open, dedup lease held); freezeLeasesLost the
	// leases_lost the frozen consumers reported after their thaw.
	freezes, freezesMid int
	freezeLeasesLost    int64
	// Transient failures (--fail-rate): the transfers planned to fail their
	// first attempt or their first two; of them, those applied only after
	// (transientApplied) and at an attempt meant to fail (transientEarly,
	// must be 0); the handler runs that failed on purpose and idemq's
	// retried counter (republished to a retry queue, any cause, or a
	// deferral republished), from the consumers' counters; the messages waiting in the retry queues as each broker
	// restart began.
	transientOnce, transientTwice    int
	transientApplied, transientEarly int
	transientFailed, retried         int64
	retryWaiting                     int
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
	Late         int            `json:"late"`
	LateWhere    map[string]int `json:"late_in_queues,omitempty"`
	HeldByBroker int            `json:"held_by_broker"`
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
	// ExitedOnTheirOwn counts consumers that exited by themselves (not
	// killed, not stopped); the supervisor restarted them. Must be 0.
	ExitedOnTheirOwn int `json:"exited_on_their_own"`
	// DBOutages and RedisOutages count the dependency outages injected;
	// ValidDeadLettered the valid transfers dead-lettered (a dependency
	// outage is not the message's fault: must be 0); OutagesSeen the
	// consumers' breaker pauses (dependency_outages, summed).
	DBOutages         int `json:"db_outages"`
	RedisOutages      int `json:"redis_outages"`
	ValidDeadLettered int `json:"valid_dead_lettered"`
	// DeadNotApplied: of those, the ones never applied (not lost: they
	// can be replayed).
	DeadNotApplied int   `json:"dead_lettered_not_applied"`
	OutagesSeen    int64 `json:"consumer_pauses"`
	// Freezes counts the consumers frozen (SIGSTOP for --freeze-duration,
	// then SIGCONT); FreezesMidHandler those frozen in a handler (effect
	// written, transaction open, dedup lease held); FreezeLeasesLost the
	// increase of the frozen consumers' leases_lost seen after their thaw
	// (dedup modes; other lease losses of theirs at that time included).
	Freezes           int   `json:"freezes"`
	FreezesMidHandler int   `json:"freezes_mid_handler"`
	FreezeLeasesLost  int64 `json:"freeze_leases_lost"`
	// Transient failures (--fail-rate): TransientOnce and TransientTwice
	// count the transfers planned to fail their first attempt and their
	// first two; TransientApplied those of them applied at a later attempt
	// (all of them when nothing is lost), TransientEarly those applied at
	// an attempt that failed (a failed attempt left its effect: must be
	// 0); TransientFailures the handler runs that failed on purpose
	// (quick retries included) and Retried idemq's retried counter (the
	// deliveries republished to a retry queue, plus deferrals republished
	// near the delivery limit), summed over the consumers (≈: a consumer killed
	// within 25 ms of an increment loses it); RetryWaitingAtRestarts the
	// messages in the retry queues as each broker restart or RabbitMQ
	// cluster fault began, summed.
	TransientOnce          int   `json:"transient_once"`
	TransientTwice         int   `json:"transient_twice"`
	TransientApplied       int   `json:"transient_applied"`
	TransientEarly         int   `json:"transient_applied_at_failing_attempt"`
	TransientFailures      int64 `json:"transient_failures"`
	Retried                int64 `json:"retried"`
	RetryWaitingAtRestarts int   `json:"retry_waiting_at_restarts"`
}

func writeLedgers(path string, ls []*ledger) error {
	var out []Ledger
	for _, l := range ls {
		out = append(out, Ledger{Mode: l.mode, Published: l.published, Unique: l.unique, Malformed: l.bad,
			Deliveries: l.deliveries, Redeliveries: l.redeliveries, Duplicates: l.dups, Applied: l.applied,
			AppliedTwice: l.twice, Lost: l.lost, Late: l.late, LateWhere: l.lateWhere, HeldByBroker: l.heldByBroker, Expected: l.expected, Actual: l.actual, DeadLettered: l.deadLettered,
			Reasons: l.reasons, Kills: l.kills, Crashes: l.crashes, Cuts: l.cuts, Exact: l.exact(),
			Redis: l.redis, RedisRestarts: l.redisRestarts, RedisKept: l.redisKept, ProxyCuts: l.proxyCuts, BrokerRestarts: l.brokerRestarts,
			ProxyConns: l.proxyConns, Reconnects: l.reconnects, StoreErrors: l.storeErrors, StuckOnSigterm: l.stuck, ExitedOnTheirOwn: l.exited,
			DBOutages: l.dbOutages, RedisOutages: l.redisOutages, ValidDeadLettered: l.validDead, DeadNotApplied: l.deadNotApplied, OutagesSeen: l.outagesSeen,
			Freezes: l.freezes, FreezesMidHandler: l.freezesMid, FreezeLeasesLost: l.freezeLeasesLost,
			TransientOnce: l.transientOnce, TransientTwice: l.transientTwice, TransientApplied: l.transientApplied,
			TransientEarly: l.transientEarly, TransientFailures: l.transientFailed, Retried: l.retried,
			RetryWaitingAtRestarts: l.retryWaiting})
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
	return l.lost == 0 && l.late == 0 && l.twice == 0 && l.expected == l.actual && l.deadLettered >= l.bad && l.validDead == 0 &&
		l.transientEarly == 0
}

// ledgerRow is one line of the table: its label and each mode's cell.
type ledgerRow struct {
	label string
	cell  func(l *ledger) string
}

func itoa(n int64) string { return fmt.Sprint(n) }

// redisOnly is v, or "-" for a mode without a dedup store.
func redisOnly(l *ledger, v string) string {
	if l.redis == "-" {
		return "-"
	}
	return v
}

// ledgerRows are the table's lines, in order.
func ledgerRows() []ledgerRow {
	return []ledgerRow{
		{"", func(l *ledger) string { return l.mode }},
		{"published (incl. resends, bad)", func(l *ledger) string { return itoa(int64(l.published)) }},
		{"unique transfers", func(l *ledger) string { return itoa(int64(l.unique)) }},
		{"deliveries seen by consumers (≈)", func(l *ledger) string { return itoa(l.deliveries) }},
		{"  of which redeliveries", func(l *ledger) string { return itoa(l.redeliveries) }},
		{"duplicates suppressed", func(l *ledger) string { return itoa(l.dups) }},
		{"consumers killed (kill -9)", func(l *ledger) string { return itoa(int64(l.crashes)) }},
		{"broker cuts / proxy cuts (conns)", func(l *ledger) string {
			return fmt.Sprintf("%d/%d (%d)", l.cuts, l.proxyCuts, l.proxyConns)
		}},
		{"broker restarts (stop/start_app)", func(l *ledger) string { return itoa(int64(l.brokerRestarts)) }},
		{"consumers frozen (SIGSTOP)", func(l *ledger) string { return itoa(int64(l.freezes)) }},
		{"  in a handler / leases lost", func(l *ledger) string {
			return fmt.Sprintf("%d/%s", l.freezesMid, redisOnly(l, itoa(l.freezeLeasesLost)))
		}},
		{"transient: transfers failing 1×/2×", func(l *ledger) string {
			return fmt.Sprintf("%d/%d", l.transientOnce, l.transientTwice)
		}},
		{"  handler runs failed (≈)", func(l *ledger) string { return itoa(l.transientFailed) }},
		{"  retried (republished) (≈)", func(l *ledger) string { return itoa(l.retried) }},
		{"  in retry queues at restarts/cluster faults", func(l *ledger) string { return itoa(int64(l.retryWaiting)) }},
		{"  applied after / at a failure", func(l *ledger) string {
			return fmt.Sprintf("%d/%d", l.transientApplied, l.transientEarly)
		}},
		{"consumers exited on their own", func(l *ledger) string { return itoa(int64(l.exited)) }},
		{"consumers stuck after SIGTERM", func(l *ledger) string { return itoa(int64(l.stuck)) }},
		{"consumer reconnects (≈)", func(l *ledger) string { return itoa(l.reconnects) }},
		{"dedup Redis", func(l *ledger) string { return l.redis }},
		{"Redis kill -9+restart (data kept)", func(l *ledger) string {
			return redisOnly(l, fmt.Sprintf("%d (%d)", l.redisRestarts, l.redisKept))
		}},
		{"dedup store errors (≈)", func(l *ledger) string { return redisOnly(l, itoa(l.storeErrors)) }},
		{"PostgreSQL / Redis outages", func(l *ledger) string {
			return fmt.Sprintf("%d/%s", l.dbOutages, redisOnly(l, itoa(int64(l.redisOutages))))
		}},
		{"consumer pauses (breaker) (≈)", func(l *ledger) string { return itoa(l.outagesSeen) }},
		{"valid transfers dead-lettered", func(l *ledger) string { return itoa(int64(l.validDead)) }},
		{"  of which never applied", func(l *ledger) string { return itoa(int64(l.deadNotApplied)) }},
		{"transfers applied", func(l *ledger) string { return itoa(int64(l.applied)) }},
		{"transfers applied twice or more", func(l *ledger) string { return itoa(int64(l.twice)) }},
		{"transfers lost", func(l *ledger) string { return itoa(int64(l.lost)) }},
		{"transfers late (still queued)", func(l *ledger) string { return itoa(int64(l.late)) }},
		{"expected total balance", func(l *ledger) string { return itoa(l.expected) }},
		{"actual total balance", func(l *ledger) string { return itoa(l.actual) }},
		{"dead-lettered (malformed: " + fmt.Sprint(len(badMessages())) + ")", func(l *ledger) string { return itoa(int64(l.deadLettered)) }},
		{"verdict", func(l *ledger) string {
			if l.exact() {
				return "EXACT"
			}
			return "WRONG"
		}},
	}
}

// printLedgers prints the modes side by side, their dead-letter reasons
// and what each mode's figures mean.
func printLedgers(w io.Writer, ls []*ledger) {
	printLedgerTable(w, ls)
	fmt.Fprintln(w)
	for _, l := range ls {
		var rs []string
		for r, n := range l.reasons {
			rs = append(rs, fmt.Sprintf("%s×%d", r, n))
		}
		sort.Strings(rs)
		fmt.Fprintf(w, "%s: dead-letter reasons %s; %d consumer restarts\n", l.mode, strings.Join(rs, ", "), l.restarted)
		for _, v := range l.validDeadSeen {
			fmt.Fprintf(w, "  valid dead letter: %s\n", v)
		}
	}
	fmt.Fprintln(w)
	printExplanations(w, ls)
}

// printLedgerTable prints one column per mode, one row per ledgerRows.
func printLedgerTable(w io.Writer, ls []*ledger) {
	width := 12
	for _, l := range ls {
		width = max(width, len(l.mode)+1)
	}
	for _, r := range ledgerRows() {
		fmt.Fprintf(w, "%-34s", r.label)
		for _, l := range ls {
			fmt.Fprintf(w, "%*s", width, r.cell(l))
		}
		fmt.Fprintln(w)
	}
}

// modeExplanations say what each mode's ledger shows.
func modeExplanations() map[string]string {
	return map[string]string{
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
}

const aofAlwaysExplanation = `                aof-always: its private Redis fsyncs every write to an
                append-only file, so a restart forgets nothing acknowledged.`

const frozenExplanation = `
frozen          a consumer stopped (SIGSTOP) in a handler — effect written, not
                committed, dedup lease held — past its lease, then continued.
                dedup: the lease is lost, so the handler's context is
                cancelled and its last statement, a lease check, fails: it
                rolls back and gives the delivery back. A worker frozen with
                its COMMIT already sent applies a transfer twice only if
                another copy (resend, redelivery) ran meanwhile: the
                after-commit window, counted as a lost lease. Inbox stays
                exact: the frozen transaction holds the inbox row.`

// printExplanations explains the modes that ran, and the freezes if any.
func printExplanations(w io.Writer, ls []*ledger) {
	for _, l := range ls {
		fmt.Fprintln(w, modeExplanations()[l.mode])
		if l.mode == modeDedup && l.redis == "aof-always" {
			fmt.Fprintln(w, aofAlwaysExplanation)
		}
	}
	for _, l := range ls {
		if l.freezes > 0 {
			fmt.Fprintln(w, frozenExplanation)
			break
		}
	}
}
