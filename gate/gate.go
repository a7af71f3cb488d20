package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/topology"
)

// Dead-letter reasons of the gate (x-idemq-reason), besides idemq's own
// missing-id and invalid-id.
const (
	// ReasonUnroutable: a target had no queue bound for the message (the
	// broker returned the mandatory publish). Fix the binding, then
	// `idemq dlq replay <ingress>` forwards it.
	ReasonUnroutable = "unroutable"
	// ReasonRefused: the broker refused the publish for good (see
	// [ErrRefused]).
	ReasonRefused = "forward-refused"
)

// Counter names the gate records (besides the consumer's and the dedup
// guard's: idemq.CountDuplicates, idemq.CountStoreErrors,
// idemq.CountDeadLettered, …).
const (
	CountForwarded  = "gate_forwarded"  // messages forwarded to every route, confirmed
	CountUnroutable = "gate_unroutable" // forwards returned unroutable (dead-lettered)
	// CountRouteSkipped: routes skipped on a redelivery because an earlier
	// delivery of the ID forwarded to them (its other routes failed).
	CountRouteSkipped   = "gate_route_skipped"
	CountRefused        = "gate_refused"         // forwards refused by the broker (dead-lettered)
	CountForwardRetries = "gate_forward_retries" // forward attempts retried (lost connection, nack, missing exchange)
	CountTargetDown     = "gate_target_unavailable"
)

// DependencyTarget names the forward targets in the idemq.UnavailableError
// of a forward that ran out of ForwardTimeout.
const DependencyTarget = "gate-target"

// IngressTopology is the topology.Queue to declare for an ingress queue
// (with `idemq topology apply`, or topology.Declare): its dead-letter
// queue and no retry queues — the gate never retries a message through a
// delay queue (that would add headers to it); it forwards, dead-letters,
// or gives it back in place.
func IngressTopology(ingress string) topology.Queue {
	return topology.Queue{Name: ingress, NoRetry: true}
}

// Gate forwards the messages of one ingress queue to its routes, each
// message ID at most once per window (see the package documentation).
type Gate struct {
	cfg      Config
	store    dedup.Store
	keep     *keepOriginal // the failure policy; keeps the headers as they arrived
	closeSt  func()
	consumer *idemq.Consumer
	fwd      *forwarder
	dlq      *idemq.Publisher
	counters *idemq.Counters
	lat      latency
	log      *slog.Logger

	mu      sync.Mutex
	running bool
}

// New validates cfg, fills its defaults and returns a gate. It connects
// to nothing until Run.
func New(cfg Config) (*Gate, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	g := &Gate{cfg: cfg, counters: &idemq.Counters{}, closeSt: func() {},
		log: cfg.Logger.With("ingress", cfg.Ingress, "group", cfg.Group)}
	g.store = cfg.Store
	if g.store == nil {
		opt, err := redis.ParseURL(cfg.RedisURL)
		if err != nil {
			return nil, fmt.Errorf("%w: Redis URL %s: %v", ErrInvalidConfig, redact.URL(cfg.RedisURL), redact.Scrub(err.Error(), redact.Secrets(cfg.RedisURL)))
		}
		rdb := redis.NewClient(opt)
		g.store, err = redisstore.New(rdb, redisstore.Config{KeyPrefix: cfg.RedisKeyPrefix})
		if err != nil {
			_ = rdb.Close()
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		g.closeSt = func() { _ = rdb.Close() }
	}
	rec := idemq.Recorder(g.counters)
	if cfg.Recorder != nil {
		rec = tee{g.counters, cfg.Recorder}
		if obs, ok := cfg.Recorder.(idemq.Observer); ok {
			rec = observingTee{tee{g.counters, cfg.Recorder}, obs}
		}
	}
	guard, err := dedup.NewGuard(dedup.Config{
		Store: g.store, Prefix: cfg.Prefix, Lease: cfg.Lease, Window: cfg.Window, Logger: cfg.Logger,
	})
	if err != nil {
		g.closeSt()
		return nil, fmt.Errorf("gate: %w", err)
	}
	g.fwd = newForwarder(cfg.URL, cfg.Dial, g.log)
	// Dead letters go through idemq's publisher (they carry the reason in
	// headers); retry.Policy sends them. With no retry delays it never
	// parks a message in a delay queue: a deferral (another gate holds the
	// ID, the store is down) waits in place, unchanged.
	g.dlq, err = idemq.NewPublisher(idemq.PublisherConfig{URL: cfg.URL, Logger: cfg.Logger, Dial: cfg.Dial, Recorder: rec})
	if err != nil {
		g.closeSt()
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	dlq := cfg.DeadLetterQueue
	if dlq == "-" {
		dlq = ""
	}
	policy, err := retry.New(retry.Config{
		Sender:          g.dlq,
		QuickAttempts:   1,
		Delays:          []time.Duration{},
		DeadLetterQueue: func(string) string { return dlq },
	})
	if err != nil {
		g.closeSt()
		return nil, fmt.Errorf("gate: %w", err)
	}
	g.keep = &keepOriginal{FailurePolicy: policy}
	g.consumer, err = idemq.NewConsumer(idemq.ConsumerConfig{
		URL:           cfg.URL,
		ManagementURL: cfg.ManagementURL,
		Queue:         cfg.Ingress,
		Group:         cfg.Group,
		ID:            cfg.ID,
		Prefetch:      cfg.Prefetch,
		Workers:       cfg.Workers,
		// The original headers are kept before the failure policy sees
		// the delivery (it drops inbound x-idemq-* headers it did not
		// write; the gate forwards every header as it came).
		Pipeline: idemq.Pipeline{Policy: g.keep, Guard: guard, Handler: idemq.HandlerFunc(g.forward)},
		Recorder: rec,
		Logger:   cfg.Logger,
		Dial:     cfg.Dial,
		Breaker: idemq.BreakerConfig{Probes: []func(context.Context) error{
			dedup.Probe(g.store), g.probeTargets,
		}},
	})
	if err != nil {
		g.closeSt()
		return nil, fmt.Errorf("gate: %w", err)
	}
	return g, nil
}

// Ready is closed once the gate consumes its ingress queue.
func (g *Gate) Ready() <-chan struct{} { return g.consumer.Ready() }

// Consuming reports whether the gate is subscribed to its ingress queue
// now (false while it reconnects to the broker).
func (g *Gate) Consuming() bool { return g.consumer.Consuming() }

// Paused reports whether the gate's circuit breaker holds deliveries
// back (its dedup store or the broker is unavailable).
func (g *Gate) Paused() bool { return g.consumer.Paused() }

// Run forwards until ctx is cancelled, then finishes the forwards in
// flight, acks them and returns nil. Lost connections and store outages
// are waited out. It closes the default Redis store's client on return.
func (g *Gate) Run(ctx context.Context) error {
	g.mu.Lock()
	if g.running {
		g.mu.Unlock()
		return errors.New("gate: Run called twice")
	}
	g.running = true
	g.mu.Unlock()
	defer g.closeSt()
	defer g.dlq.Close()
	defer g.fwd.close()
	g.log.Info("idemq gate: forwarding", "routes", fmt.Sprint(g.cfg.Routes), "window", g.cfg.Window, "lease", g.cfg.Lease, "workers", g.cfg.Workers)
	return g.consumer.Run(ctx)
}

// Check verifies, with passive declares, that the ingress queue, its
// dead-letter queue and every target exchange exist, so a misconfigured
// gate fails at start rather than dead-letter or hold back its first
// messages. The default exchange is not checked.
func (g *Gate) Check(ctx context.Context) error {
	conn, err := dialRedacted(g.cfg.Dial, g.cfg.URL, amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US",
		Properties: amqp.Table{"connection_name": "idemq gate check"}})
	if err != nil {
		return fmt.Errorf("gate: check: %w", err)
	}
	defer conn.Close()
	var errs []error
	check := func(what string, f func(*amqp.Channel) error) {
		ch, err := conn.Channel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			return
		}
		defer ch.Close()
		if err := f(ch); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}
	queues := []string{g.cfg.Ingress}
	if g.cfg.DeadLetterQueue != "-" {
		queues = append(queues, g.cfg.DeadLetterQueue)
	}
	for _, q := range queues {
		check("queue "+q, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			return err
		})
	}
	for _, r := range g.cfg.Routes {
		if r.Exchange == "" {
			continue
		}
		check("exchange "+r.Exchange, func(ch *amqp.Channel) error {
			return ch.ExchangeDeclarePassive(r.Exchange, "direct", true, false, false, false, nil)
		})
	}
	if len(errs) > 0 {
		return fmt.Errorf("gate: check (declare them with `idemq topology apply`): %w", errors.Join(errs...))
	}
	return nil
}

// probeTargets is the breaker's probe of the forward targets: each target
// exchange exists (a passive declare on a forwarder channel).
func (g *Gate) probeTargets(ctx context.Context) error {
	for _, r := range g.cfg.Routes {
		if r.Exchange == "" {
			continue
		}
		fc, err := g.fwd.take()
		if err != nil {
			return idemq.Unavailable(DependencyTarget, err)
		}
		if err := fc.ch.ExchangeDeclarePassive(r.Exchange, "direct", true, false, false, false, nil); err != nil {
			_ = fc.ch.Close()
			return idemq.Unavailable(DependencyTarget, fmt.Errorf("exchange %q: %w", r.Exchange, err))
		}
		g.fwd.give(fc)
	}
	return nil
}

// keepOriginal is the gate's failure policy: the retry policy, after it
// remembers each delivery's headers as they arrived (the retry policy's
// Admit drops inbound x-idemq-* headers it did not write; the gate
// forwards every header unchanged).
type keepOriginal struct {
	idemq.FailurePolicy
	orig sync.Map // *idemq.Delivery → amqp.Table
}

func (k *keepOriginal) Admit(d *idemq.Delivery) (idemq.Decision, bool) {
	k.orig.Store(d, d.Headers)
	dec, ok := k.FailurePolicy.Admit(d)
	if !ok {
		k.orig.Delete(d)
	}
	return dec, ok
}

func (k *keepOriginal) Decide(d *idemq.Delivery, r idemq.Run) idemq.Decision {
	dec := k.FailurePolicy.Decide(d, r)
	if dec.Action != idemq.ActionRunAgain {
		k.orig.Delete(d)
	}
	return dec
}

// DelayQueues forwards the retry policy's delay queues, so the consumer
// releases them (an embedded interface does not promote it).
func (k *keepOriginal) DelayQueues(queue string) (idemq.Sender, []idemq.DelayQueue) {
	return idemq.DelayQueuesOf(k.FailurePolicy, queue)
}

// original returns d's headers as they arrived.
func (k *keepOriginal) original(d *idemq.Delivery) amqp.Table {
	if h, ok := k.orig.Load(d); ok {
		return h.(amqp.Table)
	}
	return d.Headers
}

// publishing is the delivery as it arrived: body, every property, every
// header.
func publishing(h amqp.Table, d *idemq.Delivery) amqp.Publishing {
	return amqp.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    d.DeliveryMode,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationID,
		ReplyTo:         d.ReplyTo,
		Expiration:      d.Expiration,
		MessageId:       d.MessageID,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		UserId:          d.UserID,
		AppId:           d.AppID,
		Body:            d.Body,
	}
}

// forward is the handler, run by the dedup guard once it holds the ID's
// lease: publish to every route with confirms; the guard then completes
// the ID and the consumer acks.
func (g *Gate) forward(ctx context.Context, d *idemq.Delivery) error {
	rec := idemq.RecorderFrom(ctx)
	pub := publishing(g.keep.original(d), d)
	// The forward's deadline; not cancelled with the handler's context
	// (see forwarder.publishOnce: a publish on the wire is seen through).
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.ForwardTimeout)
	defer cancel()
	for i, r := range g.cfg.Routes {
		key := r.RoutingKey
		if key == "" {
			key = d.RoutingKey
		}
		// With several routes, each one's forward is recorded on its own
		// (routeProgress): a redelivery after a failed route forwards to
		// the routes not yet confirmed, never twice to one.
		done, mark, err := g.routeProgress(ctx, d, i)
		if err != nil {
			return err
		}
		if done {
			continue
		}
		if err := g.publish(fctx, ctx, rec, r.Exchange, key, pub); err != nil {
			_ = mark(fctx, err)
			id, _ := d.ID()
			var ret *idemq.ReturnedError
			switch {
			case errors.As(err, &ret):
				rec.Add(CountUnroutable, 1)
				return idemq.Reject(ReasonUnroutable, fmt.Errorf("gate: route %v: %w", r, err))
			case errors.Is(err, ErrRefused):
				rec.Add(CountRefused, 1)
				return idemq.Reject(ReasonRefused, fmt.Errorf("gate: route %v: %w", r, err))
			case ctx.Err() != nil:
				return err // lease lost or shutting down: the guard and the consumer give it back
			}
			rec.Add(CountTargetDown, 1)
			g.log.Warn("idemq gate: forward timed out; message given back", "message_id", id, "route", r.String(), "err", err)
			return idemq.Unavailable(DependencyTarget, fmt.Errorf("gate: route %v: %w", r, err))
		}
		if err := mark(fctx, nil); err != nil {
			return err
		}
	}
	lat := time.Since(d.ReceivedAt)
	g.lat.observe(lat)
	if lo, ok := g.cfg.Recorder.(LatencyObserver); ok {
		lo.ObserveForward(lat)
	}
	rec.Add(CountForwarded, 1)
	return nil
}

// routeProgress reports whether route i of d was forwarded already (by
// an earlier delivery of the same ID whose other routes failed) and, when
// not, returns mark, which records the forward's outcome: done for the
// dedup window on success, released on failure. A single route needs no
// record (the guard's claim of the ID is its progress). The record is the
// dedup store's "<Prefix>:<Group>:<id>#route-<i>" key, claimed under the
// guard's claim of the ID: another holder is a gate whose claim of the ID
// lapsed with a forward on the wire, so the delivery waits in place.
func (g *Gate) routeProgress(ctx context.Context, d *idemq.Delivery, i int) (done bool, mark func(context.Context, error) error, err error) {
	none := func(context.Context, error) error { return nil }
	if len(g.cfg.Routes) < 2 {
		return false, none, nil
	}
	id, err := d.ID()
	if err != nil {
		return false, none, nil // the guard dead-letters it before the handler runs
	}
	key := dedup.Key(g.cfg.Prefix, g.cfg.Group, id) + "#route-" + strconv.Itoa(i)
	token := idemq.NewMessageID()
	c, err := g.store.Claim(ctx, key, token, g.cfg.Lease)
	if err != nil {
		return false, none, idemq.Unavailable(dedup.DependencyStore, fmt.Errorf("gate: route %d progress of %q: %w", i, id, err))
	}
	switch c.Result {
	case dedup.Done:
		idemq.RecorderFrom(ctx).Add(CountRouteSkipped, 1)
		return true, none, nil
	case dedup.InFlight:
		after := max(c.LeaseLeft, time.Second)
		return false, none, idemq.RequeueInPlace(after, "route-in-flight",
			fmt.Errorf("gate: route %d of %q is being forwarded by another gate", i, id))
	}
	return false, func(mctx context.Context, failed error) error {
		// Not cancelled with the forward, but bounded: a stalled store
		// must not hold the worker past its lease.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(mctx), g.cfg.Lease)
		defer cancel()
		if failed != nil {
			_ = g.store.Release(sctx, key, token)
			return nil
		}
		if err := g.store.Complete(sctx, key, token, g.cfg.Window); err != nil && !errors.Is(err, dedup.ErrLeaseLost) {
			// Forwarded, not recorded: a redelivery may forward to this
			// route again. Not the message's fault: given back.
			return idemq.Unavailable(dedup.DependencyStore, fmt.Errorf("gate: record route %d of %q: %w", i, id, err))
		}
		return nil
	}, nil
}

// publish retries transient failures with backoff until ctx (the
// forward's deadline) or hctx (the handler's context) ends.
func (g *Gate) publish(ctx, hctx context.Context, rec idemq.Recorder, exchange, key string, pub amqp.Publishing) error {
	pol := backoff.Policy{Min: 50 * time.Millisecond, Max: 2 * time.Second}
	var last error
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			rec.Add(CountForwardRetries, 1)
			if err := backoff.Sleep(hctx, min(pol.Delay(attempt-1), time.Until(deadline(ctx)))); err != nil || ctx.Err() != nil {
				return fmt.Errorf("%w (last error: %v)", errors.Join(err, ctx.Err()), last)
			}
		}
		err := g.fwd.publishOnce(ctx, hctx, g.cfg.Lease/3, exchange, key, pub)
		if err == nil || !errors.Is(err, errTransient) {
			if err != nil && last != nil && (ctx.Err() != nil || hctx.Err() != nil) {
				return fmt.Errorf("%w (last error: %v)", err, last)
			}
			return err
		}
		last = err
		g.log.Debug("idemq gate: forward attempt failed; retrying", "exchange", exchange, "routing_key", key, "err", err)
	}
}

// tee records into the gate's counters and the configured recorder.
type tee struct{ a, b idemq.Recorder }

func (t tee) Add(name string, delta int64) { t.a.Add(name, delta); t.b.Add(name, delta) }

// observingTee is a tee whose second recorder is an idemq.Observer (the
// metrics package's): the consumer tells it every settled delivery.
type observingTee struct {
	tee
	obs idemq.Observer
}

func (t observingTee) Settled(d *idemq.Delivery, s idemq.Settlement) { t.obs.Settled(d, s) }

func deadline(ctx context.Context) time.Time {
	d, ok := ctx.Deadline()
	if !ok {
		return time.Now().Add(time.Hour)
	}
	return d
}
