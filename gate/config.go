package gate

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gopkg.in/yaml.v3"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
)

// Defaults of [Config].
const (
	DefaultWindow         = 24 * time.Hour
	DefaultLease          = 30 * time.Second
	DefaultWorkers        = 32
	DefaultPrefetch       = 256
	DefaultForwardTimeout = 30 * time.Second
	DefaultRedisURL       = "redis://127.0.0.1:6379/0"
	// GroupPrefix starts the default consumer group, "gate.<ingress>".
	GroupPrefix = "gate."
)

// ErrInvalidConfig is wrapped by every error [Config.Validate] returns.
var ErrInvalidConfig = idemq.ConfigErrorClass("gate: invalid config")

// Route is one target a message is forwarded to.
type Route struct {
	// Exchange to publish to. "" is the default exchange (RoutingKey then
	// names the queue, and is required).
	Exchange string `yaml:"exchange" json:"exchange"`
	// RoutingKey to publish with. Empty keeps the message's own routing
	// key (the one it was published to the ingress with), so a topic or
	// direct target routes it as its producer meant.
	RoutingKey string `yaml:"routing_key" json:"routing_key,omitempty"`
}

func (r Route) String() string {
	ex, key := r.Exchange, r.RoutingKey
	if ex == "" {
		ex = "(default exchange)"
	}
	if key == "" {
		key = "(message's own)"
	}
	return ex + " / " + key
}

// Config configures a [Gate]. Ingress and at least one Route are required;
// every other field has a documented default, so a zero value plus those
// two is usable.
type Config struct {
	// URL of the broker, for the ingress consumer, the forwarder and the
	// dead letters. Default: IDEMQ_AMQP_URL, else [idemq.DefaultURL].
	URL string
	// ManagementURL is the RabbitMQ management API URL
	// (http://user:password@host:15672). When set, the ingress consumer
	// reads the delivery limit the broker applies to the ingress queue (a
	// policy's included) at each connect, and the gate's failure policy
	// keeps its in-place requeues (a target unavailable) below it; see
	// idemq.ConsumerConfig.ManagementURL. Default none: the declared limit,
	// or RabbitMQ 4's 20.
	ManagementURL string
	// Ingress is the queue the gate consumes. Required. Declare it (and
	// its dead-letter queue, "<ingress>.dlq") with `idemq topology apply`,
	// no_retry: true (see [IngressTopology]).
	Ingress string
	// Routes are the targets. Every message is published to each of them,
	// in order, each confirmed before the next; the message is acked only
	// when all are. At least one is required.
	Routes []Route
	// Group namespaces the dedup keys ("<Prefix>:<Group>:<id>"). Gates
	// that share an ingress queue must share it (the default does).
	// Default "gate.<Ingress>".
	Group string
	// Prefix of the dedup keys. Default "idemq" (dedup.Config.Prefix).
	Prefix string
	// ID says where a message's ID comes from: the AMQP message_id by
	// default; a header (idemq.FromHeader("x-deduplication-header") for a
	// drop-in migration from the community plugin) or a JSON field
	// (idemq.FromJSONField) as Extractor. A message without a valid ID is
	// dead-lettered with reason missing-id or invalid-id, never forwarded
	// and never dropped.
	ID idemq.IDConfig
	// Store is the dedup store (Redis, SQL, the Bloom tier: anything that
	// implements dedup.Store). Default: the Redis store (dedup/redisstore)
	// on RedisURL, closed by Run when it returns.
	Store dedup.Store
	// RedisURL is used when Store is nil. Default IDEMQ_REDIS_URL, else
	// [DefaultRedisURL].
	RedisURL string
	// RedisKeyPrefix is redisstore.Config.KeyPrefix of the default store.
	RedisKeyPrefix string
	// Window is how long a forwarded ID is remembered: a copy arriving
	// within it is acked and counted, never forwarded. Default 24h.
	Window time.Duration
	// Lease is how long a claim holds an ID while its message is being
	// forwarded (renewed every Lease/3 while the forward runs). It bounds
	// how long a copy waits after a gate died holding it. Default 30s.
	Lease time.Duration
	// Workers forward concurrently (each on its own confirm channel).
	// Default 32.
	Workers int
	// Prefetch is the ingress consumer's QoS. Default 256.
	Prefetch int
	// ForwardTimeout bounds the forward of one message to all its routes,
	// retries included (a lost connection, a nack, a missing target
	// exchange). Past it the target counts as unavailable: the claim is
	// released, the message goes back to the ingress queue (not an
	// attempt, not dead-lettered) and the consumer pauses until the
	// target answers. Default 30s.
	ForwardTimeout time.Duration
	// DeadLetterQueue receives what cannot be forwarded, with the reason
	// in x-idemq-reason: missing-id, invalid-id, unroutable (no queue
	// bound at a target), forward-refused (the broker refused the
	// publish, e.g. a user_id that is not the gate's user). Default
	// "<Ingress>.dlq"; "-" for none (the delivery is then rejected to the
	// broker, which drops it unless the ingress has a dead-letter
	// exchange).
	DeadLetterQueue string
	// Recorder receives every counter (the consumer's, the dedup
	// guard's and the gate's CountForwarded, CountUnroutable,
	// CountRefused). If it also implements [LatencyObserver], each
	// forward's latency. Optional: [Gate.Stats] works without it.
	Recorder idemq.Recorder
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Dial overrides how AMQP connections are made (tests). Default
	// amqp.DialConfig.
	Dial func(url string, cfg amqp.Config) (*amqp.Connection, error)
}

// LatencyObserver is the optional part of a [Config.Recorder] that
// receives the latency of each forwarded message: from its receipt by the
// gate to the confirm of its last route.
type LatencyObserver interface {
	ObserveForward(d time.Duration)
}

func (c Config) withDefaults() Config {
	if c.URL == "" {
		c.URL = idemq.URLFromEnv()
	}
	if c.Group == "" && c.Ingress != "" {
		c.Group = GroupPrefix + c.Ingress
	}
	if c.Prefix == "" {
		c.Prefix = "idemq"
	}
	if c.RedisURL == "" {
		c.RedisURL = os.Getenv("IDEMQ_REDIS_URL")
	}
	if c.RedisURL == "" {
		c.RedisURL = DefaultRedisURL
	}
	if c.Window <= 0 {
		c.Window = DefaultWindow
	}
	if c.Lease <= 0 {
		c.Lease = DefaultLease
	}
	if c.Workers <= 0 {
		c.Workers = DefaultWorkers
	}
	if c.Prefetch <= 0 {
		c.Prefetch = DefaultPrefetch
	}
	if c.ForwardTimeout <= 0 {
		c.ForwardTimeout = DefaultForwardTimeout
	}
	if c.DeadLetterQueue == "" && c.Ingress != "" {
		c.DeadLetterQueue = c.Ingress + ".dlq"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Dial == nil {
		c.Dial = amqp.DialConfig
	}
	return c
}

// Validate reports what the gate cannot run with: no ingress, no route, a
// default-exchange route without a routing key, a route back to the
// ingress queue (a loop), names AMQP cannot carry.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.Ingress == "" {
		errs = append(errs, errors.New("Ingress is required"))
	}
	if err := checkName("ingress queue", c.Ingress); err != nil {
		errs = append(errs, err)
	}
	if len(c.Routes) == 0 {
		errs = append(errs, errors.New("at least one route is required"))
	}
	for i, r := range c.Routes {
		if err := checkName(fmt.Sprintf("routes[%d] exchange", i), r.Exchange); err != nil {
			errs = append(errs, err)
		}
		if err := checkName(fmt.Sprintf("routes[%d] routing key", i), r.RoutingKey); err != nil {
			errs = append(errs, err)
		}
		if r.Exchange == "" && r.RoutingKey == "" {
			errs = append(errs, fmt.Errorf("routes[%d]: the default exchange needs a routing key (the target queue)", i))
		}
		if r.Exchange == "" && r.RoutingKey == c.Ingress && c.Ingress != "" {
			errs = append(errs, fmt.Errorf("routes[%d]: routes back to the ingress queue %q (a loop)", i, c.Ingress))
		}
	}
	if c.DeadLetterQueue != "-" {
		if err := checkName("dead-letter queue", c.DeadLetterQueue); err != nil {
			errs = append(errs, err)
		}
		if c.DeadLetterQueue == c.Ingress && c.Ingress != "" {
			errs = append(errs, fmt.Errorf("dead-letter queue %q is the ingress queue (a loop)", c.DeadLetterQueue))
		}
	}
	if c.Lease < 3*time.Millisecond {
		errs = append(errs, fmt.Errorf("Lease %v is too short", c.Lease))
	}
	if c.Window < 2*c.Lease {
		// A copy that arrives while the first is being forwarded is given
		// back for up to a lease; the record must outlive that wait.
		errs = append(errs, fmt.Errorf("Window %v must be at least twice Lease %v (a copy deferred behind a lease would find the record gone)", c.Window, c.Lease))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
}

// checkName checks an AMQP short string used as a name: at most 255 bytes,
// valid UTF-8, no control characters.
func checkName(what, s string) error {
	if len(s) > 255 {
		return fmt.Errorf("%s is %d bytes, at most 255 allowed", what, len(s))
	}
	if err := idemq.ValidateID(s); err != nil && s != "" {
		return fmt.Errorf("%s %q: %w", what, s, err)
	}
	return nil
}

// RoutesFile is the YAML form of the routes (`idemq gate --routes FILE`):
//
//	routes:
//	  - exchange: orders
//	    routing_key: orders.created   # optional: default the message's own
//	  - exchange: audit
type RoutesFile struct {
	Routes []Route `yaml:"routes"`
}

// LoadRoutes reads a routes YAML file (unknown fields, a second document
// and an empty list are errors).
func LoadRoutes(r io.Reader) ([]Route, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("gate: read routes: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f RoutesFile
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("gate: routes: empty file")
		}
		return nil, fmt.Errorf("gate: parse routes YAML: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("gate: parse routes YAML: more than one YAML document (---)")
	}
	if len(f.Routes) == 0 {
		return nil, errors.New("gate: routes: no routes listed")
	}
	var errs []error
	for i, rt := range f.Routes {
		for what, s := range map[string]string{"exchange": rt.Exchange, "routing_key": rt.RoutingKey} {
			if err := checkName(fmt.Sprintf("routes[%d] %s", i, what), s); err != nil {
				errs = append(errs, err)
			}
		}
		if rt.Exchange == "" && rt.RoutingKey == "" {
			errs = append(errs, fmt.Errorf("routes[%d]: the default exchange needs a routing_key", i))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("gate: routes: %w", errors.Join(errs...))
	}
	return f.Routes, nil
}

// LoadRoutesFile reads a routes YAML file from path.
func LoadRoutesFile(path string) ([]Route, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("gate: %w", err)
	}
	return LoadRoutes(strings.NewReader(string(data)))
}
