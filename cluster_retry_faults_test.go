//go:build faults

package idemq_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/sqldb/postgres"
	"github.com/idemq/idemq/topology"
)

// Sizes of TestClusterRetryNodeLoss. The defaults keep each case to
// one node loss; make cluster-chaos-retries sets larger ones.
const (
	envClusterRetryMessages = "IDEMQ_FAULT_CLUSTER_RETRY_MESSAGES" // messages per case (default 300)
	envClusterRetryKills    = "IDEMQ_FAULT_CLUSTER_RETRY_KILLS"    // node losses per case (default 1)
	envClusterRetryCases    = "IDEMQ_FAULT_CLUSTER_RETRY_CASES"    // retry, work or all (default)
)

func envPositive(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// TestClusterRetryNodeLoss runs a real consumer given the three
// nodes' URLs, with the retry policy over the default quorum retry queues
// (at-least-once dead-lettering) and the PostgreSQL inbox, on a private
// 3-node cluster. The handler fails the first run of every message, and
// the second of every other one (a dependency hiccup), so every message
// waits in a retry queue at least once. While deliveries wait there, a
// node is killed with kill -9: in one case the node leading the retry
// queues, in the other the node leading the work queue (the retry queues'
// dead-letter target). More messages are published while it is down, and
// it is brought back while they wait. Every message must be applied
// exactly once, none dead-lettered, and every queue must drain.
//
// make cluster-chaos-retries runs it with larger sizes; make test runs its
// two cases at the default sizes inside TestFaultClusterNodeLoss. On RabbitMQ
// 3.10.8 it lost retries (1 and 15 of 300 in 2 of 6 runs) that the
// publisher reported confirmed while the retry queue had no leader:
// amqp091-go's NotifyPublish turned a nack into an ack (fixed in the
// publisher; TestPublishNackNotTurnedIntoAck, docs/RABBITMQ_VERSIONS.md).
// On a loss it logs each lost ID's trace (runs, retry publishes and their
// confirms, the kill marks) and the nodes' queue state;
// IDEMQ_FAULT_CLUSTER_RETRY_LATE=1 then waits 4 min to tell lost from
// late, IDEMQ_KEEP_FAILED_NODE=1 keeps the nodes' folders and
// IDEMQ_CLUSTER_LOG_LEVEL=debug makes their logs tell more.
func TestClusterRetryNodeLoss(t *testing.T) {
	messages := envPositive(t, envClusterRetryMessages, 300)
	kills := envPositive(t, envClusterRetryKills, 1)
	cl := testenv.StartCluster(t, testenv.ClusterConfig{Rabbit: true})
	clusterRetryCases(t, cl, messages, kills)
}

// clusterRetryCases runs the two cases of TestClusterRetryNodeLoss on cl
// (IDEMQ_FAULT_CLUSTER_RETRY_CASES picks one); each brings back the node
// it killed.
func clusterRetryCases(t *testing.T, cl *testenv.Cluster, messages, kills int) {
	dsn := testenv.PostgresDB(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(ctx, postgres.Pgx(pool), inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		retry bool // kill the retry queues' leader (else the work queue's)
	}{
		{"retry queues' leader killed", true},
		{"work queue's leader killed", false},
	} {
		if c := os.Getenv(envClusterRetryCases); c != "" && c != "all" && (c == "retry") != tc.retry {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			runClusterRetryLoss(t, cl, pool, ib, tc.retry, messages, kills)
		})
	}
}

func runClusterRetryLoss(t *testing.T, cl *testenv.Cluster, pool *pgxpool.Pool, ib *inbox.Inbox[pgx.Tx], killRetryLeader bool, messages, kills int) {
	q := topology.Queue{
		Name: testenv.Name(t, "crq"),
		Type: topology.Quorum,
		// The first wait is shorter than the node's outage, so deliveries
		// expire while it is down; the second spans its return.
		RetryDelays: []time.Duration{2 * time.Second, 6 * time.Second},
	}
	top := topology.Topology{Queues: []topology.Queue{q}}
	plan := topology.ForQueue(q)
	retries := make([]string, len(plan.Retries))
	for i, r := range plan.Retries {
		retries[i] = r.Name
	}
	all := append([]string{q.Name}, retries...)

	// Quorum queues get their leader on the node the declare came
	// through: the retry queues on node 2, the work queue and the DLQ (a
	// quorum queue: its node's loss leaves it available, so the
	// consumer's Setup declares it, TestFaultClusterNodeLoss) on node
	// 1, so the two cases kill different roles.
	withClusterChannel(t, cl.AMQPURLs[1], func(ch *amqp.Channel) error {
		for _, r := range plan.Retries {
			if _, err := ch.QueueDeclare(r.Name, true, false, false, false, r.Args); err != nil {
				return err
			}
		}
		return nil
	})
	withClusterChannel(t, cl.AMQPURLs[0], func(ch *amqp.Channel) error {
		return topology.Declare(context.Background(), ch, top)
	})
	workLeader, retryLeader := cl.Leader(q.Name), cl.Leader(retries[0])
	t.Logf("work queue %s led by node %d, retry queues %v by node %d", q.Name, workLeader, retries, retryLeader)
	if workLeader == retryLeader {
		t.Logf("the work queue and the retry queues share their leader: both cases kill both roles")
	}
	target := q.Name
	if killRetryLeader {
		target = retries[0]
	}

	fast := backoffFast()
	pubCounters := &idemq.Counters{}
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URLs: cl.AMQPURLs, Logger: quietLogger(), Retry: fast, Heartbeat: 2 * time.Second, Recorder: pubCounters})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	// MaxAttempts well above the failures: a copy handed back twice (at
	// least once) may carry a higher attempt number; a dead letter must
	// never happen.
	trace := newIDTrace()
	policy, err := retry.New(retry.ForTopology(q, retry.Config{Sender: tracingSender{pub, trace}, QuickAttempts: 1, MaxAttempts: 8,
		PublishTimeout: 30 * time.Second, PublishRetryAfter: 200 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[string]int{}
	failures := func(id string) int { // 1 or 2, by the message's number
		var round, i int
		_, _ = fmt.Sscanf(id, "m-%d-%d", &round, &i)
		return 1 + i%2
	}
	h := ib.Handler(func(ctx context.Context, tx pgx.Tx, d *idemq.Delivery) error {
		mu.Lock()
		runs[d.MessageID]++
		n := runs[d.MessageID]
		mu.Unlock()
		trace.add(d.MessageID, "run %d (attempt header %v, redelivered %v)", n, d.Headers[idemq.HeaderAttempt], d.Redelivered)
		if n <= failures(d.MessageID) {
			return fmt.Errorf("dependency hiccup (run %d of %s)", n, d.MessageID)
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, q.Name+"/"+d.MessageID)
		return err
	})
	cons, err := idemq.NewConsumer(idemq.ConsumerConfig{
		URLs: cl.AMQPURLs, Queue: q.Name, Setup: topology.SetupFunc(top), Logger: quietLogger(),
		Workers: 8, Prefetch: 100, Reconnect: fast, Heartbeat: 2 * time.Second,
		Pipeline: idemq.Pipeline{Policy: policy, Handler: h},
	})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = cons.Run(cctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-cons.Ready():
	case <-time.After(time.Minute):
		t.Fatal("consumer not ready on the cluster")
	}

	ctx := context.Background()
	applied := func() (rows, distinct int) {
		_ = pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT id) FROM effects WHERE id LIKE $1`, q.Name+"/%").Scan(&rows, &distinct)
		return
	}
	sent := 0
	publish := func(round, from, to int) {
		t.Helper()
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Minute)
		defer pcancel()
		sem := make(chan struct{}, 32)
		errs := make(chan error, to-from)
		for i := from; i < to; i++ {
			sem <- struct{}{}
			go func(i int) {
				defer func() { <-sem }()
				id := fmt.Sprintf("m-%d-%d", round, i)
				errs <- pub.Publish(pctx, idemq.Message{ID: id, RoutingKey: q.Name, Body: []byte(id)})
			}(i)
		}
		for i := from; i < to; i++ {
			if err := <-errs; err != nil {
				t.Fatalf("publish: %v", err)
			}
		}
		sent += to - from
	}
	// waiting waits until at least want deliveries wait in the retry
	// queues and returns how many: parked by the consumer and not yet
	// released (it holds them until due, unacked, so the queues' ready
	// counts do not show them).
	waiting := func(what string, want int) int {
		t.Helper()
		var n int
		c := cons.Counters()
		testenv.Eventually(t, 2*time.Minute, fmt.Sprintf("%s: %d deliveries waiting in the retry queues", what, want), func() bool {
			n = int(c.Get(idemq.CountRetried) - c.Get(idemq.CountReleased))
			return n >= want
		})
		return n
	}

	start := time.Now()
	var atKill, atReturn []int
	for k := 0; k < kills; k++ {
		batch := messages / kills / 2
		last := messages - sent - batch
		if k < kills-1 {
			last = batch
		}
		// The leader first (the lookup takes seconds on a loaded
		// machine), then the kill right as deliveries wait.
		victim := cl.Leader(target)
		publish(k, 0, batch)
		w := waiting(fmt.Sprintf("kill %d", k+1), batch/2)
		trace.mark("kill node %d (leads %s)", victim, target)
		cl.Run("kill", strconv.Itoa(victim))
		trace.mark("node %d killed", victim)
		before, _ := applied()
		// A quorum queue without a leader may answer 0 here.
		after, _ := clusterDepth(cl.AMQPURLs, victim, retries...)
		atKill = append(atKill, w)
		t.Logf("kill %d: killed node %d (leads %s) with %d deliveries waiting in the retry queues (%d right after), %d of %d sent applied",
			k+1, victim, target, w, after, before, sent)
		// While the node is down: more messages, which fail and wait in
		// the retry queues of the two survivors, and progress.
		publish(k, batch, batch+last)
		atReturn = append(atReturn, waiting(fmt.Sprintf("node %d down", victim), last/2))
		testenv.Eventually(t, 2*time.Minute, "progress while the node is down", func() bool {
			n, _ := applied()
			return n > before
		})
		trace.mark("start node %d", victim)
		cl.Run("start", strconv.Itoa(victim))
		trace.mark("node %d back", victim)
		t.Logf("kill %d: node %d back after %v", k+1, victim, time.Since(start).Round(time.Second))
	}
	// Every message applied, or nothing left to come (a message lost in a
	// retry queue never comes back): the queues empty and no progress.
	var last int
	var still time.Time
	testenv.Eventually(t, 3*time.Minute, fmt.Sprintf("all %d messages applied, or the queues empty without progress", sent), func() bool {
		_, n := applied()
		if n == sent {
			return true
		}
		if n != last || still.IsZero() {
			last, still = n, time.Now()
			return false
		}
		d, err := clusterDepth(cl.AMQPURLs, 0, all...)
		return err == nil && d == 0 && time.Since(still) > 15*time.Second
	})
	testenv.Eventually(t, 2*time.Minute, "work and retry queues empty", func() bool {
		d, err := clusterDepth(cl.AMQPURLs, 0, all...)
		return err == nil && d == 0
	})
	elapsed := time.Since(start)
	rows, distinct := applied()
	dlq, err := clusterDepth(cl.AMQPURLs, 0, plan.DLQ)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	totalRuns := 0
	for _, n := range runs {
		totalRuns += n
	}
	mu.Unlock()
	c := cons.Counters()
	t.Logf("%d messages through %d node losses (%s's leader) in %v, waiting in retry queues at each kill %v and while down %v: applied %d (rows %d), lost %d, applied twice %d, dead letters %d; handler runs %d, retried %d, duplicates suppressed %d, redelivered %d, reconnects %d; publisher: %d confirmed, %d attempts resent, %d reconnects",
		sent, kills, target, elapsed.Round(time.Second), atKill, atReturn, distinct, rows, sent-distinct, rows-distinct, dlq,
		totalRuns, c.Get(idemq.CountRetried), c.Get(idemq.CountDuplicates), c.Get(idemq.CountRedelivered), c.Get(idemq.CountReconnects),
		pubCounters.Get(idemq.CountPublished), pubCounters.Get(idemq.CountPublishRetries), pubCounters.Get(idemq.CountReconnects))
	if distinct != sent {
		t.Errorf("lost: %d of %d messages applied", distinct, sent)
		r, err := pool.Query(ctx, `SELECT id FROM effects WHERE id LIKE $1`, q.Name+"/%")
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(r, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, id := range got {
			seen[id[len(q.Name)+1:]] = true
		}
		mu.Lock()
		var lost []string
		for id, n := range runs {
			if !seen[id] {
				lost = append(lost, fmt.Sprintf("%s (runs %d)", id, n))
			}
		}
		mu.Unlock()
		sort.Strings(lost)
		t.Logf("lost: %v", lost)
		for _, l := range lost {
			id := strings.Fields(l)[0]
			t.Logf("trace of %s:\n%s", id, trace.dump(id))
		}
		dumpClusterQueues(t, cl, q.Name, retries)
		// Lost, or only late? An at-least-once dead letter the retry
		// queue's dead-letter worker forwarded without a confirm is
		// forwarded again after dead_letter_worker_publisher_confirm_timeout
		// (3 min on 3.10.8).
		if os.Getenv("IDEMQ_FAULT_CLUSTER_RETRY_LATE") != "" {
			lateStart := time.Now()
			deadline := lateStart.Add(4 * time.Minute)
			for time.Now().Before(deadline) {
				if _, n := applied(); n == sent {
					break
				}
				time.Sleep(time.Second)
			}
			_, n := applied()
			t.Logf("late: %d of %d applied %v after the loss was reported", n, sent, time.Since(lateStart).Round(time.Second))
			for _, l := range lost {
				id := strings.Fields(l)[0]
				t.Logf("trace of %s after the wait:\n%s", id, trace.dump(id))
			}
			dumpClusterQueues(t, cl, q.Name, retries)
		}
	}
	if rows != distinct {
		t.Errorf("applied twice: %d effect rows for %d messages", rows, distinct)
	}
	if dlq != 0 || c.Get(idemq.CountDeadLettered) != 0 || c.Get(idemq.CountRejected) != 0 {
		t.Errorf("dead letters: %d in %s, %d counted, %d rejected; want none (every failure was transient)",
			dlq, plan.DLQ, c.Get(idemq.CountDeadLettered), c.Get(idemq.CountRejected))
	}
}

// withClusterChannel runs f on a channel of a fresh connection to url.
func withClusterChannel(t *testing.T, url string, f func(ch *amqp.Channel) error) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := f(ch); err != nil {
		t.Fatal(err)
	}
}

// clusterDepth is the number of ready messages in the named queues, as the
// first node of urls (1-based index skip left out) that answers sees them.
func clusterDepth(urls []string, skip int, queues ...string) (int, error) {
	var errs []error
	for i, u := range urls {
		if i+1 == skip {
			continue
		}
		n, err := queueDepthAt(u, queues...)
		if err == nil {
			return n, nil
		}
		errs = append(errs, err)
	}
	return 0, errors.Join(errs...)
}

func queueDepthAt(url string, queues ...string) (int, error) {
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	total := 0
	for _, name := range queues {
		ch, err := conn.Channel()
		if err != nil {
			return 0, err
		}
		qi, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		_ = ch.Close()
		if err != nil {
			return 0, err
		}
		total += qi.Messages
	}
	return total, nil
}

// idTrace records, per message ID, the consumer side's view (handler runs,
// retry publishes and their confirms) and the test's fault marks, with
// times, for the post-mortem of a lost delivery.
type idTrace struct {
	mu    sync.Mutex
	start time.Time
	ev    map[string][]string
	marks []string
}

func newIDTrace() *idTrace { return &idTrace{start: time.Now(), ev: map[string][]string{}} }

func (tr *idTrace) stamp() string {
	return fmt.Sprintf("%s +%.3fs", time.Now().UTC().Format("15:04:05.000"), time.Since(tr.start).Seconds())
}

func (tr *idTrace) add(id, format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.ev[id] = append(tr.ev[id], tr.stamp()+" "+fmt.Sprintf(format, args...))
}

func (tr *idTrace) mark(format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.marks = append(tr.marks, tr.stamp()+" MARK "+fmt.Sprintf(format, args...))
}

func (tr *idTrace) dump(id string) string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	all := append(append([]string{}, tr.ev[id]...), tr.marks...)
	sort.Strings(all)
	out := ""
	for _, l := range all {
		out += "  " + l + "\n"
	}
	return out
}

// tracingSender records each retry publish and its outcome.
type tracingSender struct {
	s  idemq.Sender
	tr *idTrace
}

func (ts tracingSender) Publish(ctx context.Context, m idemq.Message) error {
	ts.tr.add(m.ID, "publish to %q (attempt header %v)", m.RoutingKey, m.Headers[idemq.HeaderAttempt])
	err := ts.s.Publish(ctx, m)
	ts.tr.add(m.ID, "publish to %q returned %v", m.RoutingKey, err)
	return err
}

// dumpClusterQueues logs what every running node says of the queues: the
// counts, the Raft members' status, the dead-letter workers, and each
// quorum queue's local state machine (its overview's num_discarded and
// num_discard_checked_out are the at-least-once dead letters not yet
// confirmed by their target; 3.10.8's list_queues has no messages_dlx).
func dumpClusterQueues(t *testing.T, cl *testenv.Cluster, work string, retries []string) {
	t.Helper()
	run := func(timeout time.Duration, name string, args ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
		if err != nil {
			return fmt.Sprintf("%s(error %v)", out, err)
		}
		return string(out)
	}
	qs := append([]string{work}, retries...)
	for _, n := range cl.Nodes {
		t.Logf("node %s list_queues:\n%s", n, run(time.Minute, "rabbitmqctl", "-n", n, "list_queues", "name", "type", "messages", "messages_ready",
			"messages_unacknowledged", "leader", "members", "online"))
		t.Logf("node %s dlx workers: %s", n, run(time.Minute, "rabbitmqctl", "-n", n, "eval", "supervisor:which_children(rabbit_fifo_dlx_sup)."))
		for _, q := range qs {
			t.Logf("node %s, %s: quorum_status:\n%s", n, q, run(time.Minute, "rabbitmq-queues", "-n", n, "quorum_status", q))
			expr := fmt.Sprintf(`{ok,Q}=rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>,queue,<<"%s">>)), {RN,L}=amqqueue:get_pid(Q), R=ra:local_query({RN,node()}, fun(S) -> {rabbit_fifo:overview(S), S} end), io:format("leader record ~p~n~P~n", [L, R, 40]), ok.`, q)
			t.Logf("node %s, %s: local state:\n%s", n, q, run(time.Minute, "rabbitmqctl", "-n", n, "eval", expr))
		}
	}
}
