// One mode's run, the program that proves (or disproves) the guarantees:
// plan the faults (faults.go), start the crash-prone consumers, publish
// every transfer once or twice while they are killed, wait until every
// transfer was applied, drain what is left with one clean consumer, and
// tally the mode's database and dead letters into its ledger.

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/topology"
)

// modeRun is one mode's run: its queue, database and folder, the faults
// planned for it, its consumers and its ledger.
type modeRun struct {
	o    demoOpts
	mode string
	// co is what the crash-prone consumers get: the proxy's URL and the
	// mode's Redis. The publisher, the final clean consumer and the demo's
	// own bookkeeping go to the broker directly (o).
	co     demoOpts
	suffix string // makes the mode's queue, database and transfer IDs unique
	q      topology.Queue
	dbURL  string
	dir    string // the children's logs and stats files
	pool   *pgxpool.Pool
	sup    *supervisor // the crash-prone consumers
	l      *ledger

	// restartedAt is when the mode's last broker restart ended
	// (UnixNano; 0: none).
	restartedAt atomic.Int64
	// keepQueues is set when a queue of the mode still holds a transfer
	// at the end (a late one): the queues are kept for inspection.
	keepQueues bool

	events []faultEvent // fired as the consumers progress (runAtProgress)
	// The publisher holds at these points until a fault has begun, so that
	// every fault meets a backlog whatever the speeds: halfway through
	// until the first dependency outage began (holdForOutage), at the
	// keys of clusterHold until that cluster fault began, at the keys of
	// freezeArmed until that freeze armed its consumer.
	holdForOutage bool
	outageSignal  chan struct{}
	outageOnce    sync.Once
	clusterHold   map[int]chan struct{}
	freezeArmed   map[int]chan struct{}

	cleanups []func() // run in reverse order when the run ends
}

// runMode runs one mode and returns its ledger.
func runMode(ctx context.Context, o demoOpts, mode string) (*ledger, error) {
	r := &modeRun{o: o, co: o, mode: mode, suffix: idemq.NewMessageID()[28:]}
	defer r.close()
	if err := r.setUp(ctx); err != nil {
		return nil, err
	}
	if err := r.planFaults(ctx); err != nil {
		return nil, err
	}
	if err := r.startConsumers(ctx); err != nil {
		return nil, err
	}
	faults := r.startFaults(ctx)
	if err := r.publish(ctx); err != nil {
		return nil, err
	}
	if err := r.waitSettled(ctx, faults); err != nil {
		return nil, err
	}
	r.drain(ctx)
	if err := r.tally(ctx); err != nil {
		return nil, err
	}
	return r.l, nil
}

// onExit registers f to run when the run ends, before the ones registered
// earlier.
func (r *modeRun) onExit(f func()) { r.cleanups = append(r.cleanups, f) }

func (r *modeRun) close() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// setUp creates the mode's database, folder and queue names, and its
// empty ledger.
func (r *modeRun) setUp(ctx context.Context) error {
	queue := fmt.Sprintf("bank.demo.%s.%s", r.mode, r.suffix)
	dbURL, drop, err := modeDB(ctx, r.o.pgURL, "bank_demo_"+strings.ReplaceAll(r.mode, "-", "_")+"_"+r.suffix)
	if err != nil {
		return err
	}
	r.onExit(drop)
	r.dbURL = dbURL
	if r.dir, err = os.MkdirTemp("", "bank-demo-"); err != nil {
		return err
	}
	r.l = &ledger{mode: r.mode, reasons: map[string]int{}, lateWhere: map[string]int{}, redis: "-"}
	// The children's logs are kept when one of them hung on SIGTERM: its
	// goroutine dump is in there.
	r.onExit(func() {
		if r.l.stuck > 0 {
			fmt.Fprintf(os.Stderr, "%s: consumer logs kept in %s\n", r.mode, r.dir)
			return
		}
		os.RemoveAll(r.dir)
	})
	r.q = bankQueue(queue, r.o.queueType)
	r.onExit(func() {
		// RabbitMQ 3.10.8 loses its dead-letter supervisor when quorum
		// retry queues are deleted while their dead-letter workers are
		// still starting after a restart (docs/RABBITMQ_VERSIONS.md): the
		// broker would then nack every later retry publish, the next
		// mode's or test's included. Let the workers start first.
		if r.keepQueues {
			fmt.Fprintf(os.Stderr, "%s: queues of %s kept: they hold transfers that came late\n", r.mode, r.q.Name)
			return
		}
		waitAfterRestart(r.restartedAt.Load(), restartSettle)
		deleteQueues(r.o.amqpURL, topology.ForQueue(r.q))
	})
	return nil
}

// startConsumers opens the demo's pool on the mode's database, plans the
// freezes (they need the supervisor) and starts the crash-prone consumers.
func (r *modeRun) startConsumers(ctx context.Context) error {
	pool, err := pgxpool.New(ctx, r.dbURL)
	if err != nil {
		return err
	}
	r.onExit(pool.Close)
	r.pool = pool
	r.sup = newSupervisor("crashy", r.co, r.mode, r.q.Name, r.dbURL, r.dir)
	r.planFreezes()
	r.sup.start(r.o.consumers)
	return nil
}

// transferID is the message ID of the mode's i-th transfer.
func (r *modeRun) transferID(i int) string { return fmt.Sprintf("t-%s-%d", r.suffix, i) }

// publish publishes every transfer (some twice, same ID and body) while
// the consumers work and get killed, then the malformed messages.
func (r *modeRun) publish(ctx context.Context) error {
	o, l := r.o, r.l
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: o.amqpURL, URLs: splitList(o.amqpURLs),
		Setup: topology.SetupFunc(topology.Topology{Queues: []topology.Queue{r.q}})})
	if err != nil {
		return err
	}
	r.onExit(func() { _ = pub.Close() })
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	pubCtx, cancel := context.WithTimeout(ctx, o.timeout)
	r.onExit(cancel)
	killEvery := o.messages / (o.kills + 1)
	cutAt := map[int]bool{}
	for i := 1; i <= o.cuts; i++ {
		cutAt[i*o.messages/(o.cuts+1)+killEvery/2] = true
	}
	for i := 0; i < o.messages; i++ {
		r.holdAt(pubCtx, i)
		if err := r.publishTransfer(pubCtx, pub, rng, i); err != nil {
			return err
		}
		if killEvery > 0 && i > 0 && i%killEvery == 0 && l.kills < o.kills {
			if r.sup.killOne(rng) {
				l.kills++
			}
		}
		if cutAt[i] {
			r.cutConnections(ctx)
		}
	}
	if err := rawPublish(pubCtx, o.amqpURL, r.q.Name, badMessages()); err != nil {
		return err
	}
	l.published += len(badMessages())
	l.bad = len(badMessages())
	l.unique = o.messages
	return nil
}

// publishTransfer publishes the i-th transfer, a random amount to a random
// account, twice for --resend percent of them, and adds it to the
// expected total.
func (r *modeRun) publishTransfer(ctx context.Context, pub *idemq.Publisher, rng *rand.Rand, i int) error {
	amount := int64(1 + rng.IntN(100))
	r.l.expected += amount
	body, _ := json.Marshal(transfer{Account: fmt.Sprintf("acc-%d", rng.IntN(20)), Amount: amount})
	times := 1
	if rng.IntN(100) < r.o.resendPct {
		times = 2 // the publisher resends: same ID, same body
	}
	for k := 0; k < times; k++ {
		if err := pub.Publish(ctx, idemq.Message{ID: r.transferID(i), RoutingKey: r.q.Name, Body: body, ContentType: "application/json"}); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		r.l.published++
	}
	return nil
}

// holdAt holds the publisher before the i-th transfer while a fault due
// there has not begun (see modeRun), never past ctx nor, for outages and
// freezes, past half the timeout.
func (r *modeRun) holdAt(ctx context.Context, i int) {
	if r.holdForOutage && i == r.o.messages/2 {
		select {
		case <-r.outageSignal:
		case <-ctx.Done():
		case <-time.After(r.o.timeout / 2):
			fmt.Fprintf(os.Stderr, "(no dependency outage started within %v; publishing on) ", r.o.timeout/2)
		}
	}
	if started, ok := r.clusterHold[i]; ok {
		select {
		case <-started:
		case <-ctx.Done():
		}
	}
	if armed, ok := r.freezeArmed[i]; ok {
		select {
		case <-armed:
		case <-ctx.Done():
		case <-time.After(r.o.timeout / 2):
			fmt.Fprintf(os.Stderr, "(no freeze armed within %v; publishing on) ", r.o.timeout/2)
		}
	}
}

// cutConnections closes every connection on the broker (--cuts).
func (r *modeRun) cutConnections(ctx context.Context) {
	if err := rabbitmqctl(ctx, "close_all_connections", "bank demo: connection cut"); err == nil {
		r.l.cuts++
	} else {
		fmt.Fprintf(os.Stderr, "(connection cut skipped: %v) ", err)
	}
}

// waitSettled waits until every transfer was applied at least once, every
// bad one dead-lettered and every fault fired (or the time is up: then
// what is missing is "lost", and the faults that did not fire are not
// counted). A fault that failed stops the consumers and is the error.
func (r *modeRun) waitSettled(ctx context.Context, faults *faultRunner) error {
	deadline := time.Now().Add(r.o.timeout)
	var peeked time.Time
	for time.Now().Before(deadline) && ctx.Err() == nil {
		faults.poll()
		if faults.err != nil {
			break
		}
		applied, _ := distinctApplied(ctx, r.pool)
		dl, _ := queueDepth(r.o.amqpURL, r.q.Name+".dlq")
		if applied < r.o.messages && dl > r.l.bad && time.Since(peeked) > 2*time.Second {
			// More dead letters than malformed messages: a valid transfer
			// may be among them. One dead-lettered without ever being
			// applied is settled (not lost, not coming): tally reports it.
			peeked = time.Now()
			applied += r.deadNotApplied(ctx)
		}
		if applied >= r.o.messages && dl >= r.l.bad && faults.finished {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	faults.wait()
	if faults.err != nil && !errors.Is(faults.err, context.Canceled) {
		r.sup.stopAll()
		return fmt.Errorf("fault injection: %w", faults.err)
	}
	return nil
}

// deadNotApplied counts the mode's transfers in its DLQ that were never
// applied.
func (r *modeRun) deadNotApplied(ctx context.Context) int {
	ids, err := peekIDs(r.o.amqpURL, r.q.Name+".dlq")
	if err != nil {
		return 0
	}
	counts, err := appliedCounts(ctx, r.pool)
	if err != nil {
		return 0
	}
	n := 0
	for id := range ids {
		if strings.HasPrefix(id, "t-"+r.suffix+"-") && counts[id] == 0 {
			n++
		}
	}
	return n
}

// drain lets the crash-prone consumers go and finishes with one clean
// consumer, so that everything still queued (redeliveries after a kill)
// is seen; it stops it (SIGTERM: it finishes in-flight work and acks it)
// once the queue is empty or a quarter of the timeout has passed.
func (r *modeRun) drain(ctx context.Context) {
	r.sup.stopAll()
	o := r.o
	final := newSupervisor("final", demoOpts{amqpURL: o.amqpURL, redisURL: r.co.redisURL, queueType: o.queueType,
		amqpURLs: o.amqpURLs, sentinels: o.sentinels, master: o.master, redisCluster: o.redisCluster, failRate: o.failRate}, r.mode, r.q.Name, r.dbURL, r.dir)
	final.start(1)
	quiet := time.Now().Add(o.timeout / 4)
	for time.Now().Before(quiet) && ctx.Err() == nil {
		depth, _ := queueDepth(o.amqpURL, r.q.Name)
		if depth == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	final.stopAll()
	r.tallyConsumers(r.sup, final)
}

// tallyConsumers adds the consumers' crashes, restarts and counters to the
// ledger.
func (r *modeRun) tallyConsumers(sup, final *supervisor) {
	l := r.l
	l.crashes = sup.crashes()
	l.restarted = sup.restarts()
	l.stuck = sup.stuck() + final.stuck()
	l.exited = sup.exited() + final.exited()
	for _, s := range append(sup.stats(), final.stats()...) {
		l.deliveries += s[idemq.CountDelivered]
		l.redeliveries += s[idemq.CountRedelivered]
		l.dups += s[idemq.CountDuplicates]
		l.reconnects += s[idemq.CountReconnects]
		l.storeErrors += s[idemq.CountStoreErrors]
		l.outagesSeen += s[idemq.CountDependencyOutages]
		l.transientFailed += s[countTransient]
		l.retried += s[idemq.CountRetried]
	}
}

// tally counts, from the mode's database, the transfers applied, applied
// twice or more and lost, and the actual total balance; and from its DLQ
// the dead letters, their reasons and the valid transfers among them.
func (r *modeRun) tally(ctx context.Context) error {
	l := r.l
	counts, err := appliedCounts(ctx, r.pool)
	if err != nil {
		return err
	}
	first, err := firstAttempts(ctx, r.pool)
	if err != nil {
		return err
	}
	missing := map[string]bool{}
	for i := 0; i < r.o.messages; i++ {
		if k := transientFailures(r.transferID(i), r.o.failRate); k > 0 {
			r.tallyTransient(k, first[r.transferID(i)])
		}
		switch n := counts[r.transferID(i)]; {
		case n == 0:
			missing[r.transferID(i)] = true
		case n > 1:
			l.twice++
		}
		if counts[r.transferID(i)] > 0 {
			l.applied++
		}
	}
	l.lost = len(missing)
	if len(missing) > 0 {
		// Late or lost: a transfer still in one of the mode's queues
		// (the work queue, a retry queue) came late; only what is
		// nowhere is lost. The queues are then kept.
		where, held := findInQueues(r.o.amqpURL, topology.ForQueue(r.q), missing)
		for id, q := range where {
			l.late++
			l.lateWhere[q]++
			delete(missing, id)
		}
		l.lost -= len(where)
		l.heldByBroker = held
		if len(where) > 0 || held > 0 {
			r.keepQueues = true
		}
	}
	if err := r.pool.QueryRow(ctx, `SELECT COALESCE(SUM(balance),0) FROM accounts`).Scan(&l.actual); err != nil {
		return err
	}
	dls, err := drainReasons(r.o.amqpURL, r.q.Name+".dlq")
	if err != nil {
		return err
	}
	for _, dl := range dls {
		l.deadLettered++
		l.reasons[dl.reason]++
		if !strings.HasPrefix(dl.id, "t-"+r.suffix+"-") {
			continue
		}
		l.validDead++
		if len(l.validDeadSeen) < 5 {
			l.validDeadSeen = append(l.validDeadSeen, fmt.Sprintf("%s (%s: %s)", dl.id, dl.reason, dl.err))
		}
		if missing[dl.id] && l.lost > 0 {
			// Never applied, but dead-lettered with a reason: it can be
			// replayed, it is not lost. validDead shows it.
			delete(missing, dl.id)
			l.lost--
			l.deadNotApplied++
		}
	}
	return nil
}

// tallyTransient counts a transfer meant to fail its first k attempts,
// first the lowest attempt that applied it (0: never applied).
func (r *modeRun) tallyTransient(k, first int) {
	l := r.l
	if k == 1 {
		l.transientOnce++
	} else {
		l.transientTwice++
	}
	switch {
	case first == 0:
	case first <= k:
		l.transientEarly++
	default:
		l.transientApplied++
	}
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
