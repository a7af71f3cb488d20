// The faults a mode's run injects as its consumers progress: proxy cuts of
// the consumers' connections, broker restarts, cluster faults, restarts and
// outages of the dedup modes' private Redis, outages of the private
// PostgreSQL, and consumer freezes. Each is a faultEvent due at a point of
// progress; runAtProgress fires them in order (faultRunner runs it
// alongside the publisher). Kills and broker-wide cuts are the publisher's
// (run.go).

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/topology"
)

// planFaults plans every fault but the freezes (startConsumers plans
// those), in this order: runAtProgress keeps it for faults due at the
// same point. It starts the proxy and the private Redis a fault needs;
// the consumers go through them (r.co).
func (r *modeRun) planFaults(ctx context.Context) error {
	r.outageSignal = make(chan struct{})
	r.holdForOutage = r.o.pg != nil || (r.o.redisOutages > 0 && isDedup(r.mode))
	if err := r.planProxyCuts(); err != nil {
		return err
	}
	r.planBrokerRestarts()
	r.planClusterFaults()
	if err := r.planRedis(ctx); err != nil {
		return err
	}
	r.planDBOutages()
	return nil
}

// at adds a fault due once the consumers wrote at rows to bank_applied.
func (r *modeRun) at(at int, fire func(ctx context.Context) error) {
	r.events = append(r.events, faultEvent{at: at, fire: fire})
}

// outageStarted is called by the mode's first dependency outage as it
// begins: the publisher holds the second half of the transfers until
// then, so the outage always meets a backlog (the case that dead-lettered
// valid transfers), whatever the speeds.
func (r *modeRun) outageStarted() { r.outageOnce.Do(func() { close(r.outageSignal) }) }

// planProxyCuts puts the crash-prone consumers behind a TCP proxy of the
// demo's and plans --proxy-cuts cuts of every connection through it.
func (r *modeRun) planProxyCuts() error {
	o, l := r.o, r.l
	if o.proxyCuts <= 0 {
		return nil
	}
	u, err := url.Parse(o.amqpURL)
	if err != nil {
		return fmt.Errorf("amqp URL: %w", err)
	}
	px, err := startProxy(u.Host)
	if err != nil {
		return err
	}
	r.onExit(px.close)
	if r.co.amqpURL, err = px.proxyURL(o.amqpURL); err != nil {
		return err
	}
	for k := 1; k <= o.proxyCuts; k++ {
		r.at((2*k-1)*o.messages/(2*(o.proxyCuts+1)), func(ctx context.Context) error {
			l.proxyCuts++
			l.proxyConns += px.cut(ctx, 5*time.Second)
			return nil
		})
	}
	return nil
}

// planBrokerRestarts plans --broker-restarts restarts of the broker,
// between the proxy cuts and the Redis restarts. With --fail-rate each
// waits (up to retryWaitMax) until deliveries wait in the retry queues,
// and counts them.
func (r *modeRun) planBrokerRestarts() {
	o, l := r.o, r.l
	for k := 1; k <= o.brokerRestarts; k++ {
		r.at((4*k-1)*o.messages/(4*(o.brokerRestarts+1)), func(ctx context.Context) error {
			if o.failRate > 0 {
				l.retryWaiting += r.waitRetryWaiting(ctx)
			}
			err := restartBroker(ctx)
			r.restartedAt.Store(time.Now().UnixNano())
			if err != nil {
				return err
			}
			l.brokerRestarts++
			return nil
		})
	}
}

// retryWaitMax bounds how long a broker restart waits for deliveries in
// the retry queues (--fail-rate).
const retryWaitMax = 5 * time.Second

// waitRetryWaiting waits until the mode's retry queues hold messages (at
// most retryWaitMax) and returns how many they hold: the ready ones, and
// the ones the consumers hold until they are due (parked and not yet
// released, from the consumers' counters; approximate after a kill).
func (r *modeRun) waitRetryWaiting(ctx context.Context) int {
	deadline := time.Now().Add(retryWaitMax)
	for {
		n := 0
		for _, q := range topology.ForQueue(r.q).Retries {
			d, _ := queueDepth(r.o.amqpURL, q.Name)
			n += d
		}
		var parked int64
		for _, st := range r.sup.stats() {
			parked += st[idemq.CountRetried] - st[idemq.CountReleased]
		}
		n += int(max(parked, 0))
		if n > 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// planClusterFaults plans --cluster-faults (redis-failover in the dedup
// modes only): fault k fires once the consumers applied k/(F+1) of the
// transfers; the publisher holds half a step later until it has started,
// so every fault meets a backlog and publishes go on during it. With
// --fail-rate a RabbitMQ fault first waits (up to retryWaitMax) until
// deliveries wait in the retry queues, and counts them.
func (r *modeRun) planClusterFaults() {
	var faults []string
	for _, f := range r.o.clusterFaults {
		if !isRedisFault(f) || isDedup(r.mode) {
			faults = append(faults, f)
		}
	}
	r.clusterHold = map[int]chan struct{}{}
	for k, f := range faults {
		started := make(chan struct{})
		step := r.o.messages / (len(faults) + 1)
		r.clusterHold[(k+1)*step+step/2] = started
		r.at((k+1)*step, func(ctx context.Context) error {
			// With --fail-rate, as before a broker restart: the fault
			// meets deliveries waiting in the retry queues.
			if r.o.failRate > 0 && !isRedisFault(f) {
				r.l.retryWaiting += r.waitRetryWaiting(ctx)
			}
			return clusterFault(ctx, r.o.clusterScript, f, r.q.Name, started)
		})
	}
}

// planRedis picks the dedup modes' Redis: the Sentinels', the shared one,
// or a private redis-server (aof-always for dedup, no persistence for
// dedup-nopersist) that --redis-restarts and --redis-outages hit.
func (r *modeRun) planRedis(ctx context.Context) error {
	o, l := r.o, r.l
	switch {
	case isDedup(r.mode) && o.sentinels != "":
		l.redis = "sentinel"
		return nil
	case isDedup(r.mode) && o.redisCluster != "":
		l.redis = "cluster"
		return nil
	case r.mode == modeDedup && o.redisRestarts == 0 && o.redisOutages == 0:
		l.redis = "shared"
		return nil
	case !isDedup(r.mode):
		return nil
	}
	rs, err := startPrivateRedis(ctx, r.dir, r.mode == modeDedup)
	if err != nil {
		return err
	}
	r.onExit(rs.stop)
	l.redis = rs.variant()
	r.co.redisURL = rs.url()
	for k := 1; k <= o.redisRestarts; k++ {
		r.at(k*o.messages/(o.redisRestarts+1), func(ctx context.Context) error {
			kept, err := rs.restart(ctx)
			if err != nil {
				return err
			}
			l.redisRestarts++
			if kept {
				l.redisKept++
			}
			return nil
		})
	}
	for k := 1; k <= o.redisOutages; k++ {
		// Between the restarts: a Redis down for seconds under a backlog.
		r.at((2*k-1)*o.messages/(2*(o.redisOutages+1)), func(ctx context.Context) error {
			if err := rs.outage(ctx, o.redisOutageDur, r.outageStarted); err != nil {
				return err
			}
			l.redisOutages++
			return nil
		})
	}
	return nil
}

// planDBOutages plans --db-outages outages of the demo's private
// PostgreSQL (the one o.pg runs).
func (r *modeRun) planDBOutages() {
	o, l := r.o, r.l
	if o.pg == nil {
		return
	}
	for k := 1; k <= o.dbOutages; k++ {
		shape := o.dbOutageShapes[(k-1)%len(o.dbOutageShapes)]
		r.at((3*k-1)*o.messages/(3*(o.dbOutages+1)), func(ctx context.Context) error {
			// A consumer killed a second into the outage (at most half of
			// it): its successor starts while the database is unavailable,
			// and must wait. The kill is counted with the others (killed).
			started := func() {
				r.outageStarted()
				go func() {
					select {
					case <-time.After(min(time.Second, o.dbOutageDur/2)):
						r.sup.killOne(rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 13)))
					case <-ctx.Done():
					}
				}()
			}
			if err := o.pg.outage(ctx, shape, o.dbOutageDur, started); err != nil {
				return fmt.Errorf("database outage (%s): %w", shape, err)
			}
			l.dbOutages++
			return nil
		})
	}
}

// planFreezes plans --freezes freezes of the crash-prone consumers. Freeze
// k fires at a progress point below k/(freezes+1) of the transfers, and
// the publisher holds there until the freeze has armed its consumer:
// whatever the speeds, transfers keep coming while the armed consumer
// waits for a handler to stop in.
func (r *modeRun) planFreezes() {
	o, l := r.o, r.l
	// The freezes run on the fault goroutine: a rand of their own.
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	r.freezeArmed = make(map[int]chan struct{})
	for k := 1; k <= o.freezes; k++ {
		armed := make(chan struct{})
		var once sync.Once
		r.freezeArmed[k*o.messages/(o.freezes+1)] = armed
		r.at((5*k-2)*o.messages/(5*(o.freezes+1)), func(ctx context.Context) error {
			defer once.Do(func() { close(armed) })
			fr := r.sup.freezeOne(ctx, rng, o.freezeDur, consumerMode(r.mode) == modeDedup, func() { once.Do(func() { close(armed) }) })
			if fr.frozen {
				l.freezes++
			}
			if fr.midHandler {
				l.freezesMid++
			}
			l.freezeLeasesLost += fr.leasesLost
			return nil
		})
	}
}

// faultRunner runs the mode's fault events (runAtProgress) on a goroutine
// of its own.
type faultRunner struct {
	stop     context.CancelFunc
	done     chan error
	finished bool  // runAtProgress returned
	err      error // what it returned
}

// startFaults starts firing the planned faults as the consumers progress,
// so they hit the run in the middle whatever the publishing speed.
func (r *modeRun) startFaults(ctx context.Context) *faultRunner {
	fctx, stop := context.WithCancel(ctx)
	r.onExit(stop)
	f := &faultRunner{stop: stop, done: make(chan error, 1)}
	go func() { f.done <- runAtProgress(fctx, r.pool, r.events) }()
	return f
}

// poll notes whether the faults are finished, without waiting.
func (f *faultRunner) poll() {
	if f.finished {
		return
	}
	select {
	case f.err = <-f.done:
		f.finished = true
	default:
	}
}

// wait cancels the faults not yet due and waits for the one in progress.
func (f *faultRunner) wait() {
	if f.finished {
		return
	}
	f.stop()
	f.err = <-f.done
	f.finished = true
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

// isRedisFault tells the cluster faults that hit the dedup modes' Redis.
func isRedisFault(f string) bool { return f == "redis-failover" || f == "redis-cluster-kill" }

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
	case "redis-cluster-kill":
		args = []string{"redis-cluster-kill"}
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
