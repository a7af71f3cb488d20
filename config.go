package idemq

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/internal/mgmt"
	"github.com/idemq/idemq/internal/redact"
)

// DefaultURL is the broker used when a config leaves URL empty and
// IDEMQ_AMQP_URL is unset.
const DefaultURL = "amqp://guest:guest@127.0.0.1:5672/"

// URLFromEnv returns IDEMQ_AMQP_URL, or [DefaultURL].
func URLFromEnv() string {
	if u := os.Getenv("IDEMQ_AMQP_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// SetupFunc declares topology on a fresh channel. The consumer and the
// publisher call it after every (re)connect, so it must be idempotent.
type SetupFunc func(ctx context.Context, ch *amqp.Channel) error

// ConsumerConfig configures a [Consumer]. Queue and Pipeline.Handler are
// required; every other field has a documented default, filled by
// [NewConsumer] (the zero value of a field means its default).
type ConsumerConfig struct {
	// URL of the broker. Default: IDEMQ_AMQP_URL, else [DefaultURL]
	// (when URLs is empty too).
	URL string
	// URLs lists the nodes of a cluster, one URL each (URL, when set too,
	// joins the list). Every (re)connect tries them in a fresh random
	// order, the node of the connection that just ended last, and takes
	// the first that answers; the Reconnect backoff runs between passes
	// over the whole list.
	URLs []string
	// Queue to consume from. Required.
	Queue string
	// Group names the consumer group: dedup keys and inbox rows are
	// namespaced by it, so two services consuming the same message each
	// process it once. Default: Queue.
	Group string
	// ID says where a delivery's message ID comes from; it is decided once
	// per delivery, before any layer runs, and every layer reads it with
	// [Delivery.ID]. The zero value uses the AMQP message_id only.
	ID IDConfig
	// Pipeline is what runs for each delivery, in a fixed order: the
	// failure policy, your middleware, the dedup guard, the handler (see
	// [Pipeline]). Pipeline.Handler is required.
	Pipeline Pipeline
	// Prefetch is the channel QoS (unacked deliveries in flight). Default 200.
	Prefetch int
	// Workers is the number of handler goroutines. Default 4, or the most
	// that Pipeline.Guard or Pipeline.Handler suggests when it implements
	// [WorkerHint] (the dedup guard on a store that groups calls, the
	// Redis store: enough workers for its round trips to be shared: 64
	// with the guard's defaults; the batch inbox, inbox.Batcher: two
	// batches' worth, 100 with its defaults).
	Workers int
	// AckBatch is the number of acks coalesced into one multiple-ack.
	// Default 50; 1 acks each delivery on its own.
	AckBatch int
	// AckFlushInterval bounds how long a coalesced ack waits. Default 20ms.
	AckFlushInterval time.Duration
	// Setup declares topology after each (re)connect. Optional.
	Setup SetupFunc
	// StartupAttempts bounds the connection attempts before the first
	// subscription: Run returns a [*StartupError] after that many failed
	// attempts. Default 0: retry until the context ends (the broker may
	// still be starting). Permanent errors (access refused, queue not
	// found, conflicting declaration, invalid URL) end Run at startup
	// whatever this is; after the first subscription every error is
	// retried.
	StartupAttempts int
	// LoginGrace is how long a refused login (AMQP 403 at connection open:
	// "username or password not allowed", "no access to this vhost") is
	// retried before the first subscription instead of ending Run as
	// permanent. A RabbitMQ node that is still booting refuses logins for
	// a moment, exactly as it refuses a wrong password, so a consumer
	// started during a broker restart (a supervisor, Kubernetes) would
	// otherwise exit. Default 10s; negative: a refused login is permanent
	// at once. Each refused attempt is logged at warn.
	LoginGrace time.Duration
	// Reconnect is the backoff between connection attempts.
	// Default 100ms doubling to 10s, with jitter.
	Reconnect backoff.Policy
	// ShutdownTimeout is how long in-flight handlers may run after the Run
	// context is cancelled before their own context is cancelled. Default 30s.
	ShutdownTimeout time.Duration
	// HandlerTimeout bounds one run of the handler: its context gets a
	// deadline (cause [ErrHandlerTimeout]), and a handler that fails after
	// it is a failed attempt ([*HandlerTimeoutError]) for the failure
	// policy — the dedup guard releases its claim, the inbox rolls back.
	// Default 0: no limit of its own; the handler is still bounded below
	// ConsumerTimeout (29 min with the defaults).
	HandlerTimeout time.Duration
	// ConsumerTimeout is the broker's consumer_timeout for this queue (the
	// broker closes the channel and redelivers when a delivery stays
	// unacked that long). Handlers are bounded below it: the effective
	// handler deadline is min(start+HandlerTimeout, receipt +
	// ConsumerTimeout - ConsumerTimeoutMargin). Default
	// [DefaultConsumerTimeout] (30 min, RabbitMQ's default); set it to the
	// broker's value when lower; negative: the broker has none.
	ConsumerTimeout time.Duration
	// ConsumerTimeoutMargin is how long before ConsumerTimeout handlers are
	// cancelled, leaving time to settle the delivery; a delivery that
	// waited in the consumer until less than this is left is given back
	// without running. Default ConsumerTimeout/10, at most 1 min.
	ConsumerTimeoutMargin time.Duration
	// StuckHandlerAfter logs a delivery still being handled after this
	// long (message ID, age), again at every doubling, and counts it
	// ([CountStuckHandlers]). Default 1 min; negative: never.
	StuckHandlerAfter time.Duration
	// Heartbeat for the AMQP connection. Default 10s.
	Heartbeat time.Duration
	// ConsumerTag; default "idemq-<group>-<random>".
	ConsumerTag string
	// Recorder receives counters; default an in-memory [Counters]
	// (see [Consumer.Counters]).
	Recorder Recorder
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Breaker pauses taking deliveries while a dependency is unavailable
	// (see [BreakerConfig]). On by default. The probes of the pipeline's
	// layers ([Prober]: the dedup guard, an inbox handler) are added to
	// Breaker.Probes.
	Breaker BreakerConfig
	// Release hands the failure policy's delayed retries back to Queue
	// when they are due (see [DelayedRetries], [ReleaseConfig]). On by
	// default when the policy parks deliveries in delay queues.
	Release ReleaseConfig
	// Dial overrides how the connection is made (tests use it to go through a
	// fault-injecting proxy). Default amqp.DialConfig.
	Dial func(url string, cfg amqp.Config) (*amqp.Connection, error)
	// ManagementURL is the broker's management HTTP API (the
	// rabbitmq_management plugin), with credentials:
	// http(s)://user:password@host:15672 (a monitoring user is enough).
	// When set, the consumer reads the delivery limit the broker applies
	// to Queue — the smallest of its x-delivery-limit argument and the
	// delivery-limit of the policy and operator policy that apply, which
	// AMQP cannot show — at startup and after every reconnect, logs it at
	// info with its source, and hands it to the failure policy with each
	// delivery ([Delivery.QueueDeliveryLimit]): retry.Policy then keeps
	// in-place requeues below it (see retry.Config.RequeueLimit). The
	// vhost is the connection's. If it cannot be read before the first
	// subscription, Run does not consume: a wrong password, a missing
	// permission or queue, a response idemq does not understand end Run
	// with a permanent [*StartupError]; anything else (the API not
	// answering) is retried like a connection failure, within
	// StartupAttempts. After the first subscription a failed read keeps
	// the last limit and logs a warning. A running consumer reads it
	// again every ManagementRefresh. Default "": not read (the
	// policy relies on its own RequeueLimit). Never logged or shown with
	// its password.
	ManagementURL string
	// ManagementTimeout bounds one read of the delivery limit, including
	// the wait for the statistics of a queue declared a moment ago (the
	// management API reports a queue's policy at its next statistics
	// collection, every 5 s by default). Default 30s.
	ManagementTimeout time.Duration
	// ManagementRefresh is how often a running consumer reads the limit
	// again, so a policy changed while it runs counts without a
	// reconnect (a failed refresh keeps the last limit and logs a
	// warning). Default 1 min; negative: only at each (re)connect.
	ManagementRefresh time.Duration
	// ManagementClient makes the management API requests (custom TLS
	// roots, a proxy). Default: net/http's client with a 10 s timeout per
	// request.
	ManagementClient *http.Client

	// AtStart, when set, runs in the background each time Run starts,
	// with a context that ends when Run returns; Run does not wait for it,
	// and a panic in it is logged, not raised.
	// For checks of the deployment that log what they find:
	// doctor.AtStart(logger, doctor.Config{...}) checks the queues, the
	// stores and the horizons this consumer relies on. Default nil.
	AtStart func(ctx context.Context)
}

// withDefaults returns c with every unset field at its default.
func (c ConsumerConfig) withDefaults() ConsumerConfig {
	if c.URL == "" && len(c.URLs) == 0 {
		c.URL = URLFromEnv()
	}
	if c.Group == "" {
		c.Group = c.Queue
	}
	if c.Prefetch <= 0 {
		c.Prefetch = 200
	}
	if c.Workers <= 0 {
		c.Workers = 4
		for _, l := range []any{c.Pipeline.Guard, c.Pipeline.Handler} {
			if h, ok := l.(WorkerHint); ok {
				c.Workers = max(c.Workers, min(h.SuggestWorkers(c.Prefetch), c.Prefetch))
			}
		}
	}
	if c.AckBatch <= 0 {
		c.AckBatch = 50
	}
	if c.LoginGrace == 0 {
		c.LoginGrace = DefaultLoginGrace
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.ConsumerTimeout == 0 {
		c.ConsumerTimeout = DefaultConsumerTimeout
	}
	if c.ConsumerTimeout > 0 && c.ConsumerTimeoutMargin == 0 {
		c.ConsumerTimeoutMargin = min(c.ConsumerTimeout/10, time.Minute)
	}
	if c.StuckHandlerAfter == 0 {
		c.StuckHandlerAfter = time.Minute
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 10 * time.Second
	}
	if c.ConsumerTag == "" {
		c.ConsumerTag = "idemq-" + c.Group + "-" + NewMessageID()[24:]
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Dial == nil {
		c.Dial = amqp.DialConfig
	}
	if c.ManagementTimeout <= 0 {
		c.ManagementTimeout = 30 * time.Second
	}
	if c.ManagementRefresh == 0 {
		c.ManagementRefresh = time.Minute
	}
	c.Breaker = c.Breaker.withDefaults()
	c.Release = c.Release.withDefaults()
	if c.Pipeline.Policy == nil {
		c.Pipeline.Policy = BasePolicy{RetryAfter: c.Breaker.RetryAfter}
	}
	return c
}

// Validate reports a configuration the consumer cannot run with: no Queue,
// no handler, a negative HandlerTimeout, a ConsumerTimeoutMargin that is
// not below half of ConsumerTimeout.
func (c ConsumerConfig) Validate() error {
	if c.Queue == "" {
		return fmt.Errorf("%w: ConsumerConfig.Queue is required", ErrInvalidConfig)
	}
	if err := c.Pipeline.Validate(); err != nil {
		return err
	}
	c = c.withDefaults()
	if c.ManagementURL != "" {
		if _, err := mgmt.New(c.ManagementURL, c.ManagementClient); err != nil {
			return fmt.Errorf("%w: ConsumerConfig.ManagementURL: %w", ErrInvalidConfig, err)
		}
	}
	if c.HandlerTimeout < 0 {
		return fmt.Errorf("%w: ConsumerConfig.HandlerTimeout %v is negative", ErrInvalidConfig, c.HandlerTimeout)
	}
	if c.ConsumerTimeout > 0 && (c.ConsumerTimeoutMargin < 0 || c.ConsumerTimeoutMargin*2 >= c.ConsumerTimeout) {
		return fmt.Errorf("%w: ConsumerConfig.ConsumerTimeoutMargin %v must be positive and less than half of ConsumerTimeout %v", ErrInvalidConfig,
			c.ConsumerTimeoutMargin, c.ConsumerTimeout)
	}
	return nil
}

// DefaultConsumerTimeout is RabbitMQ's default consumer_timeout (since 3.8.15).
const DefaultConsumerTimeout = 30 * time.Minute

// DefaultLoginGrace is ConsumerConfig.LoginGrace's default.
const DefaultLoginGrace = 10 * time.Second

// BreakerConfig configures the consumer's dependency circuit breaker.
//
// A dependency that is down (the database, the dedup store) is not the
// message's fault. When handlers report it — an error for which
// [IsUnavailable] holds, as the inbox, the dedup guard and the retry
// policy return for a lost connection or a store that does not answer —
// the breaker opens: the consumer stops taking deliveries from the broker
// (what the client already holds stays unacked in its buffer, not
// processed), the deliveries in flight are given back with requeue (not
// counted as attempts), and it waits for the dependency:
//
//   - with Probes: it runs them (after a backoff that grows per failed
//     round) and resumes when every one succeeds;
//   - without: after each backoff it lets one delivery through
//     (half-open); the breaker closes when that delivery's handler chain
//     succeeds and opens again when it reports the dependency unavailable.
//
// Each outage is logged twice (when the consumer pauses, and when it
// resumes, with the outage's duration) and counted: [CountDependencyOutages]
// once per outage, [CountPausedMillis] its length, [CountUnavailable] each
// delivery given back.
type BreakerConfig struct {
	// Disabled turns the breaker off: deliveries keep being taken while a
	// dependency is down (each is still given back uncounted).
	Disabled bool
	// Threshold is the number of consecutive deliveries reporting a
	// dependency unavailable that open the breaker. Default 1: the first
	// one (a probe closes it again at once if it was a blip).
	Threshold int
	// Probes check the dependencies (the inbox's Probe, dedup.Probe(store),
	// a db.PingContext). Optional; see above.
	Probes []func(ctx context.Context) error
	// Backoff between probe rounds (or half-open trials). Default 100ms
	// doubling to 2s, with jitter: the consumer resumes within about 2s of
	// the dependency's return.
	Backoff backoff.Policy
	// ProbeTimeout bounds one probe round. Default 5s.
	ProbeTimeout time.Duration
	// RetryAfter is how long a delivery that reported a dependency
	// unavailable waits before the consumer gives it back, when its error
	// does not say (a [RequeueError]'s After). Default 1s.
	RetryAfter time.Duration
	// AskTimeout bounds the probe run that decides whether a failure in a
	// shape nobody listed is an outage (see internal/breaker): with Probes,
	// a failed run whose error is not a duplicate, permanent, rejected,
	// a deferral or already an outage is an attempt only if every probe
	// passes within AskTimeout; otherwise it is an outage, not counted.
	// Default 2s; negative: never ask (only errors for which
	// [IsUnavailable] holds are outages).
	AskTimeout time.Duration
	// AskReuse is how long a probe answer decides later failures without
	// asking again. Default 250ms.
	AskReuse time.Duration
}

func (c BreakerConfig) withDefaults() BreakerConfig {
	if c.Threshold <= 0 {
		c.Threshold = 1
	}
	if c.Backoff.Min <= 0 {
		c.Backoff.Min = 100 * time.Millisecond
	}
	if c.Backoff.Max <= 0 {
		c.Backoff.Max = 2 * time.Second
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = 5 * time.Second
	}
	if c.RetryAfter <= 0 {
		c.RetryAfter = time.Second
	}
	if c.AskTimeout == 0 {
		c.AskTimeout = 2 * time.Second
	}
	if c.AskReuse <= 0 {
		c.AskReuse = 250 * time.Millisecond
	}
	return c
}

// ReleaseConfig configures how a [Consumer] releases the delay queues of
// its failure policy ([DelayedRetries]): retry.Policy parks a delivery
// that should run again later in "<queue>.retry.<ms>", stamped with
// [HeaderDue]; the consumer takes it from there when it is due,
// republishes it to its work queue (confirmed) and acks it. Every
// consumer of a queue releases its delay queues, so they drain as long as
// one runs. The zero value is usable.
type ReleaseConfig struct {
	// Disabled leaves the delay queues to the broker: only delay queues
	// declared with message TTLs and dead-lettering back to the work
	// queue (topology retry_route: dead-letter) return deliveries by
	// themselves. With the default retry queues nothing returns while no
	// consumer releases them.
	Disabled bool
	// Prefetch bounds the deliveries held per delay queue. Default 200.
	Prefetch int
	// Publishers bounds the concurrent republishes per delay queue.
	// Default 16.
	Publishers int
}

func (c ReleaseConfig) withDefaults() ReleaseConfig {
	if c.Prefetch <= 0 {
		c.Prefetch = 200
	}
	if c.Publishers <= 0 {
		c.Publishers = 16
	}
	return c
}

// PublisherConfig configures a [Publisher]. The zero value is usable.
type PublisherConfig struct {
	// URL of the broker. Default: IDEMQ_AMQP_URL, else [DefaultURL]
	// (when URLs is empty too).
	URL string
	// URLs lists the nodes of a cluster, one URL each (URL, when set too,
	// joins the list); a (re)connect tries them in a fresh random order,
	// the node of the connection that just ended last (see
	// [ConsumerConfig.URLs]). The Retry backoff runs between passes.
	URLs []string
	// Setup declares topology after each (re)connect. Optional.
	Setup SetupFunc
	// MaxInFlight bounds publishes awaiting their confirm. Default 4096.
	MaxInFlight int
	// Retry is the backoff between attempts of one publish (after a nack or
	// a lost connection). Default 50ms doubling to 5s, with jitter.
	Retry backoff.Policy
	// MaxAttempts bounds the attempts of one publish; 0 means retry until
	// the context is done. Set a context deadline either way.
	MaxAttempts int
	// Heartbeat for the AMQP connection. Default 10s.
	Heartbeat time.Duration
	// Recorder receives counters (published, publish_retries). Optional.
	Recorder Recorder
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Dial overrides how the connection is made. Default amqp.DialConfig.
	Dial func(url string, cfg amqp.Config) (*amqp.Connection, error)
}

// Validate reports a configuration [NewPublisher] refuses: a broker URL
// that does not parse (matching [ErrInvalidURL]), or a negative bound.
func (c PublisherConfig) Validate() error {
	for _, u := range append([]string{c.URL}, c.URLs...) {
		if u == "" {
			continue
		}
		if _, err := amqp.ParseURI(u); err != nil {
			return fmt.Errorf("%w %s: want amqp[s]://user:password@host:port/vhost[?params]", ErrInvalidURL, redact.URL(u))
		}
	}
	switch {
	case c.MaxInFlight < 0:
		return fmt.Errorf("%w: PublisherConfig.MaxInFlight %d is negative", ErrInvalidConfig, c.MaxInFlight)
	case c.MaxAttempts < 0:
		return fmt.Errorf("%w: PublisherConfig.MaxAttempts %d is negative", ErrInvalidConfig, c.MaxAttempts)
	case c.Heartbeat < 0:
		return fmt.Errorf("%w: PublisherConfig.Heartbeat %v is negative", ErrInvalidConfig, c.Heartbeat)
	}
	return nil
}

// withDefaults fills the documented defaults.
func (c PublisherConfig) withDefaults() PublisherConfig {
	if c.URL == "" && len(c.URLs) == 0 {
		c.URL = URLFromEnv()
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 4096
	}
	if c.Retry.Min <= 0 {
		c.Retry.Min = 50 * time.Millisecond
	}
	if c.Retry.Max <= 0 {
		c.Retry.Max = 5 * time.Second
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Dial == nil {
		c.Dial = amqp.DialConfig
	}
	return c
}
