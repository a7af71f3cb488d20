package topology

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
	"gopkg.in/yaml.v3"

	"github.com/idemq/idemq/internal/headerval"
)

// QueueType is the RabbitMQ queue type.
type QueueType string

// Queue types.
const (
	Classic QueueType = "classic"
	Quorum  QueueType = "quorum"
)

// DefaultRetryDelays are the delays of the retry queues when a [Queue] does
// not list its own; the retry package uses the same defaults.
var DefaultRetryDelays = []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute}

// DefaultDeliveryLimit is the x-delivery-limit of a quorum queue whose
// DeliveryLimit is 0.
const DefaultDeliveryLimit = 20

// DLQDeliveryLimit is the x-delivery-limit of a quorum dead-letter queue.
// A dead-letter queue has no dead-letter target of its own, so a message
// past its limit is dropped; without a declared limit RabbitMQ 4.0 and
// later apply 20, which a dead letter inspected 20 times (idemq dlq list
// peeks and gives back) would reach. 3.x rejects a negative limit, so the
// declared one is far beyond any inspection instead.
const DLQDeliveryLimit = 1_000_000

// Topology is everything to declare.
type Topology struct {
	Exchanges []Exchange `yaml:"exchanges" json:"exchanges,omitempty"`
	Queues    []Queue    `yaml:"queues" json:"queues,omitempty"`
	Bindings  []Binding  `yaml:"bindings" json:"bindings,omitempty"`
}

// Exchange is a durable exchange.
type Exchange struct {
	Name string `yaml:"name" json:"name"`
	// Type: direct (default), fanout, topic, headers.
	Type       string         `yaml:"type" json:"type,omitempty"`
	AutoDelete bool           `yaml:"auto_delete" json:"auto_delete,omitempty"`
	Internal   bool           `yaml:"internal" json:"internal,omitempty"`
	Args       map[string]any `yaml:"args" json:"args,omitempty"`
}

// Queue is a durable work queue together with its failure flow.
type Queue struct {
	Name string `yaml:"name" json:"name"`
	// Type: classic (default) or quorum.
	Type QueueType `yaml:"type" json:"type,omitempty"`
	// DeliveryLimit is the quorum x-delivery-limit backstop. 0 means
	// [DefaultDeliveryLimit]; negative means none. Ignored for classic queues.
	DeliveryLimit int `yaml:"delivery_limit" json:"delivery_limit,omitempty"`
	// DLQ names the dead-letter queue. Default "<name>.dlq"; "-" means no
	// dead-letter queue (and no x-dead-letter-* arguments on the work queue).
	DLQ string `yaml:"dlq" json:"dlq,omitempty"`
	// DLQType is the type of the dead-letter queue. Default [Quorum]: it
	// has a member on every node of a cluster, so a node loss leaves it
	// available, and it is declared with [DLQDeliveryLimit]. [Classic]
	// keeps the DLQ of idemq before v0.x (an existing classic DLQ cannot be
	// redeclared as quorum: see docs/OPERATIONS.md); a classic queue lives
	// on one node, and while that node is down declaring it fails on
	// every node (so does a consumer's Setup) and the broker cannot route
	// dead letters to it (the retry policy then holds them back).
	DLQType QueueType `yaml:"dlq_type" json:"dlq_type,omitempty"`
	// RetryDelays are the delays of the retry queues, in attempt order.
	// Default [DefaultRetryDelays]. Rounded to whole milliseconds.
	RetryDelays []time.Duration `yaml:"retry_delays" json:"retry_delays,omitempty"`
	// NoRetry declares no retry queues.
	NoRetry bool `yaml:"no_retry" json:"no_retry,omitempty"`
	// RetryType is the type of the retry queues. Default [Quorum]: a
	// member on every node of a cluster, so a node loss leaves a delivery
	// waiting for its retry available. [Classic] keeps the retry queues
	// of idemq before v0.x (an existing classic retry queue cannot be
	// redeclared as quorum: delete it when empty, or keep classic); with
	// RetryRoute dead-letter it is at most once: RabbitMQ can drop what
	// expires while the broker restarts (see docs/GUARANTEES.md).
	RetryType QueueType `yaml:"retry_type" json:"retry_type,omitempty"`
	// RetryRoute is how a delivery gets back from a retry queue to the
	// work queue. Default [RouteRelease]: the retry queues have no TTL
	// and no dead-letter route; the consumers of the work queue take
	// each delivery when it is due (x-idemq-due), republish it with a
	// confirm and ack it (idemq.DelayedRetries). [RouteDeadLetter]: the
	// retry queues of idemq before v0.x, x-message-ttl and a dead-letter
	// route back (at least once on quorum queues); the broker returns
	// expired deliveries by itself, but after a restart RabbitMQ 3.10 can
	// hold them for minutes (docs/GUARANTEES.md). An existing retry queue
	// cannot be redeclared with other arguments: keep dead-letter, or
	// drain and delete the retry queues first.
	RetryRoute RetryRoute `yaml:"retry_route" json:"retry_route,omitempty"`
	// Args are extra work-queue arguments (they must not contradict the
	// ones computed here).
	Args map[string]any `yaml:"args" json:"args,omitempty"`
}

// RetryRoute is how deliveries get back from the retry queues.
type RetryRoute string

// Retry routes.
const (
	// RouteRelease: the work queue's consumers release each delivery when
	// it is due (the default).
	RouteRelease RetryRoute = "release"
	// RouteDeadLetter: message TTL and the broker's dead-letter route.
	RouteDeadLetter RetryRoute = "dead-letter"
)

// Binding binds a queue to an exchange.
type Binding struct {
	Exchange   string         `yaml:"exchange" json:"exchange"`
	Queue      string         `yaml:"queue" json:"queue"`
	RoutingKey string         `yaml:"routing_key" json:"routing_key,omitempty"`
	Args       map[string]any `yaml:"args" json:"args,omitempty"`
}

// Argument names used by the failure flow.
const (
	ArgQueueType     = "x-queue-type"
	ArgDLX           = "x-dead-letter-exchange"
	ArgDLRoutingKey  = "x-dead-letter-routing-key"
	ArgMessageTTL    = "x-message-ttl"
	ArgDeliveryLimit = "x-delivery-limit"
	ArgDLStrategy    = "x-dead-letter-strategy"
	ArgOverflow      = "x-overflow"
)

// Values of the quorum retry queues' arguments.
const (
	// DLStrategyAtLeastOnce makes a quorum queue keep a dead-lettered
	// message until the target queue confirmed it (RabbitMQ 3.10+).
	DLStrategyAtLeastOnce = "at-least-once"
	// OverflowRejectPublish is required by at-least-once dead-lettering
	// (with drop-head the broker silently falls back to at most once).
	OverflowRejectPublish = "reject-publish"
)

// RetryArgs returns the arguments of a retry queue of type typ ("" is
// [Quorum]) holding messages of queue for delay, for route ("" is
// [RouteRelease]). Released retry queues are plain durable queues (a
// quorum one with [DLQDeliveryLimit], as nothing may drop what waits in
// it); dead-letter ones add x-message-ttl and a dead-letter route back to
// queue through the default exchange, at least once on quorum queues.
func RetryArgs(route RetryRoute, typ QueueType, queue string, delay time.Duration) amqp.Table {
	if typ == "" {
		typ = Quorum
	}
	args := amqp.Table{ArgQueueType: string(typ)}
	if route != RouteDeadLetter {
		if typ == Quorum {
			args[ArgDeliveryLimit] = int64(DLQDeliveryLimit)
		}
		return args
	}
	args[ArgMessageTTL] = roundMS(delay)
	args[ArgDLX] = ""
	args[ArgDLRoutingKey] = queue
	if typ == Quorum {
		args[ArgDLStrategy] = DLStrategyAtLeastOnce
		args[ArgOverflow] = OverflowRejectPublish
	}
	return args
}

// DLQName is the default dead-letter queue of a work queue: "<queue>.dlq".
func DLQName(queue string) string { return queue + ".dlq" }

// RetryQueueName is the delay queue of a work queue for one delay:
// "<queue>.retry.<milliseconds>".
func RetryQueueName(queue string, delay time.Duration) string {
	return queue + ".retry." + strconv.FormatInt(roundMS(delay), 10)
}

func roundMS(d time.Duration) int64 {
	ms := (d + time.Millisecond/2).Milliseconds()
	if ms < 1 {
		ms = 1
	}
	return ms
}

// RetryQueue is one delay queue.
type RetryQueue struct {
	Name  string
	Delay time.Duration // whole milliseconds
	Args  amqp.Table
}

// Plan is what [ForQueue] computes for a work queue: names and arguments of
// the work queue, its dead-letter queue and its retry queues. Both [Declare]
// and the retry package use it.
type Plan struct {
	Queue         string
	Type          QueueType
	Args          amqp.Table // work queue
	DLQ           string     // "" when disabled
	DLQType       QueueType  // "" when disabled
	DLQArgs       amqp.Table
	DeliveryLimit int             // effective x-delivery-limit (0: none)
	Notes         []string        // what the plan means where it is not obvious (no DLQ, no limit)
	Delays        []time.Duration // in attempt order (may repeat)
	Retries       []RetryQueue    // one per distinct delay, ascending
	RetryRoute    RetryRoute      // how deliveries come back from Retries (never "")
}

// EffectiveDelays returns q's retry delays (defaults applied, rounded to
// milliseconds); nil when NoRetry.
func (q Queue) EffectiveDelays() []time.Duration {
	if q.NoRetry {
		return nil
	}
	src := q.RetryDelays
	if len(src) == 0 {
		src = DefaultRetryDelays
	}
	out := make([]time.Duration, len(src))
	for i, d := range src {
		out[i] = time.Duration(roundMS(d)) * time.Millisecond
	}
	return out
}

// ForQueue computes the plan of q. It does not validate q (see
// [Topology.Validate]).
func ForQueue(q Queue) Plan {
	typ := q.Type
	if typ == "" {
		typ = Classic
	}
	p := Plan{Queue: q.Name, Type: typ, Args: amqp.Table{}}
	for k, v := range q.Args {
		p.Args[k] = normalise(v)
	}
	// What the plan computes always wins over Args (Validate rejects a
	// contradiction; this keeps the plan true for an unvalidated Queue).
	p.Args[ArgQueueType] = string(typ)
	delete(p.Args, ArgDLX)
	delete(p.Args, ArgDLRoutingKey)
	delete(p.Args, ArgDeliveryLimit)
	switch q.DLQ {
	case "-":
	case "":
		p.DLQ = DLQName(q.Name)
	default:
		p.DLQ = q.DLQ
	}
	if p.DLQ != "" {
		p.Args[ArgDLX] = ""
		p.Args[ArgDLRoutingKey] = p.DLQ
		p.DLQType = q.DLQType
		if p.DLQType == "" {
			p.DLQType = Quorum
		}
		p.DLQArgs = amqp.Table{ArgQueueType: string(p.DLQType)}
		if p.DLQType == Quorum {
			p.DLQArgs[ArgDeliveryLimit] = int64(DLQDeliveryLimit)
		}
	}
	if typ == Quorum {
		switch {
		case q.DeliveryLimit > 0:
			p.DeliveryLimit = q.DeliveryLimit
		case q.DeliveryLimit == 0:
			p.DeliveryLimit = DefaultDeliveryLimit
		}
		if p.DeliveryLimit > 0 {
			p.Args[ArgDeliveryLimit] = int64(p.DeliveryLimit)
		} else {
			p.Notes = append(p.Notes, "no x-delivery-limit (delivery_limit < 0): nothing at the broker bounds a redelivery loop")
		}
	}
	if p.DLQ == "" {
		p.Notes = append(p.Notes, `no dead-letter queue (dlq: "-"): a delivery that fails for good is rejected (nack without requeue) and the broker drops it`)
	}
	p.Delays = q.EffectiveDelays()
	p.RetryRoute = q.RetryRoute
	if p.RetryRoute == "" {
		p.RetryRoute = RouteRelease
	}
	seen := map[time.Duration]bool{}
	for _, d := range p.Delays {
		if seen[d] {
			continue
		}
		seen[d] = true
		p.Retries = append(p.Retries, RetryQueue{
			Name:  RetryQueueName(q.Name, d),
			Delay: d,
			Args:  RetryArgs(q.RetryRoute, q.RetryType, q.Name, d),
		})
	}
	sort.Slice(p.Retries, func(i, j int) bool { return p.Retries[i].Delay < p.Retries[j].Delay })
	return p
}

// RetryFor returns the retry queue to use for a wait of at least d: the
// smallest delay >= d, else the largest. ok is false when the plan has no
// retry queues.
func (p Plan) RetryFor(d time.Duration) (RetryQueue, bool) {
	if len(p.Retries) == 0 {
		return RetryQueue{}, false
	}
	for _, r := range p.Retries {
		if r.Delay >= d {
			return r, true
		}
	}
	return p.Retries[len(p.Retries)-1], true
}

// Queue returns the queue named name, or ok=false.
func (t Topology) Queue(name string) (Queue, bool) {
	for _, q := range t.Queues {
		if q.Name == name {
			return q, true
		}
	}
	return Queue{}, false
}

// MaxNameLength is the longest queue or exchange name AMQP allows, in bytes.
const MaxNameLength = 255

// reservedArgs are work-queue arguments the plan computes itself; Args
// must not set them (x-queue-type may repeat Type).
var reservedArgs = map[string]string{
	ArgDLX:           `use dlq (dlq: "-" for none)`,
	ArgDLRoutingKey:  `use dlq (dlq: "-" for none)`,
	ArgDeliveryLimit: "use delivery_limit",
}

// intArgs are arguments the broker reads as a non-negative integer (times
// in milliseconds, lengths, sizes). A string such as "1h" reaches the
// broker as a string, which it ignores or refuses.
var intArgs = map[string]string{
	ArgMessageTTL:                 "an integer number of milliseconds",
	"x-expires":                   "an integer number of milliseconds",
	"x-max-length":                "an integer",
	"x-max-length-bytes":          "an integer number of bytes",
	"x-max-priority":              "an integer",
	"x-max-in-memory-length":      "an integer",
	"x-max-in-memory-bytes":       "an integer number of bytes",
	"x-quorum-initial-group-size": "an integer",
}

// validateArgs checks arguments the broker will be sent: encodable, and the
// integer ones integers.
func validateArgs(where string, args map[string]any) []error {
	var errs []error
	keys := make([]string, 0, len(args))
	for k := range args {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := args[k]
		if want, ok := intArgs[k]; ok {
			if n, ok := headerval.Integer(v); !ok || n < 0 {
				errs = append(errs, fmt.Errorf("%s: args %s must be %s >= 0, got %T %v", where, k, want, v, v))
				continue
			}
		}
		if err := (amqp.Table{k: normalise(v)}).Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: args %s: the broker cannot be sent %T %v: %w", where, k, v, v, err))
		}
	}
	return errs
}

func validateName(kind, name string) error {
	if len(name) > MaxNameLength {
		return fmt.Errorf("%s %s: name is %d bytes, at most %d bytes allowed", kind, quoteName(name), len(name), MaxNameLength)
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("%s %s: name is not valid UTF-8", kind, quoteName(name))
	}
	for i, r := range name {
		if unicode.IsControl(r) {
			// A newline or a tab in a name is a typo, and YAML cannot
			// always write it back (a name of "\n" reloads as "").
			return fmt.Errorf("%s %s: name has a control character %U at byte %d", kind, quoteName(name), r, i)
		}
	}
	return nil
}

// quoteName quotes a name for an error message, shortened when long.
func quoteName(n string) string {
	if len(n) > 64 {
		return fmt.Sprintf("%.48q…(%d bytes)", n, len(n))
	}
	return fmt.Sprintf("%q", n)
}

// Warnings names what Validate accepts but loses messages on a broker
// restart: a quorum work queue with classic retry queues on the
// dead-letter route. Classic retry
// queues dead-letter at most once, and after a restart they recover and
// expire their messages before the quorum work queue has a leader, so
// RabbitMQ drops them ("leader not known. Command is dropped"): 300 of 900
// lost through 3 restarts in topology.TestFaultRetryQueuesSurviveBrokerRestarts.
// It stays valid because an existing classic retry queue cannot be
// redeclared as quorum in place (see docs/RABBITMQ_VERSIONS.md, upgrading);
// `idemq topology apply` prints these warnings.
func (t Topology) Warnings() []string {
	var ws []string
	for _, q := range t.Queues {
		if q.Type == Quorum && q.RetryType == Classic && q.RetryRoute == RouteDeadLetter && !q.NoRetry {
			ws = append(ws, fmt.Sprintf("queue %s: classic retry queues with a quorum work queue lose deliveries waiting for a retry when the broker restarts; "+
				"use retry_type: quorum (drain and delete the classic retry queues first)", quoteName(q.Name)))
		}
	}
	return ws
}

// Validate checks names, types, delays, arguments and the failure flow of
// every queue: a contradiction between type and args, arguments the plan
// computes itself, a dead-letter queue that is the queue itself or another
// work queue, integer arguments given as strings or fractions.
func (t Topology) Validate() error {
	var errs []error
	exchanges := map[string]bool{"": true, "amq.direct": true, "amq.fanout": true, "amq.topic": true, "amq.headers": true, "amq.match": true}
	declared := map[string]bool{}
	for i, e := range t.Exchanges {
		if e.Name == "" {
			errs = append(errs, fmt.Errorf("exchanges[%d]: name is required", i))
		}
		if declared[e.Name] && e.Name != "" {
			errs = append(errs, fmt.Errorf("exchange %q: declared twice", e.Name))
		}
		declared[e.Name] = true
		if err := validateName("exchange", e.Name); err != nil {
			errs = append(errs, err)
		}
		switch e.Type {
		case "", amqp.ExchangeDirect, amqp.ExchangeFanout, amqp.ExchangeTopic, amqp.ExchangeHeaders:
		default:
			errs = append(errs, fmt.Errorf("exchange %q: unknown type %q", e.Name, e.Type))
		}
		errs = append(errs, validateArgs(fmt.Sprintf("exchange %q", e.Name), e.Args)...)
		exchanges[e.Name] = true
	}
	queues := map[string]bool{}
	dlqTypes := map[string]QueueType{}
	for _, q := range t.Queues {
		queues[q.Name] = true
	}
	seen := map[string]bool{}
	for i, q := range t.Queues {
		if q.Name == "" {
			errs = append(errs, fmt.Errorf("queues[%d]: name is required", i))
			continue
		}
		where := "queue " + quoteName(q.Name)
		if seen[q.Name] {
			errs = append(errs, fmt.Errorf("%s: declared twice", where))
		}
		seen[q.Name] = true
		if strings.HasPrefix(q.Name, "amq.") {
			errs = append(errs, fmt.Errorf("%s: names starting with \"amq.\" are reserved by the broker", where))
		}
		typ := q.Type
		switch typ {
		case "":
			typ = Classic
		case Classic, Quorum:
		default:
			errs = append(errs, fmt.Errorf("%s: unknown type %q (classic or quorum)", where, q.Type))
		}
		for _, d := range q.RetryDelays {
			if d <= 0 {
				errs = append(errs, fmt.Errorf("%s: retry delay %v must be positive", where, d))
			}
		}
		switch q.RetryType {
		case "", Classic, Quorum:
		default:
			errs = append(errs, fmt.Errorf("%s: unknown retry_type %q (quorum or classic)", where, q.RetryType))
		}
		switch q.RetryRoute {
		case "", RouteRelease, RouteDeadLetter:
		default:
			errs = append(errs, fmt.Errorf("%s: unknown retry_route %q (release or dead-letter)", where, q.RetryRoute))
		}
		switch q.DLQType {
		case "", Classic, Quorum:
		default:
			errs = append(errs, fmt.Errorf("%s: unknown dlq_type %q (quorum or classic)", where, q.DLQType))
		}
		if q.DLQ == "-" && q.DLQType != "" {
			errs = append(errs, fmt.Errorf("%s: dlq_type is set but dlq is \"-\" (none); drop one", where))
		}
		if q.NoRetry && len(q.RetryDelays) > 0 {
			errs = append(errs, fmt.Errorf("%s: no_retry and retry_delays are both set; keep one", where))
		}
		if typ != Quorum && q.DeliveryLimit != 0 {
			errs = append(errs, fmt.Errorf("%s: delivery_limit applies to quorum queues only (set type: quorum, or drop it)", where))
		}
		if v, ok := q.Args[ArgQueueType]; ok {
			if sv, _ := v.(string); sv != string(typ) {
				errs = append(errs, fmt.Errorf("%s: args x-queue-type %q contradicts type %q; set type: %v and drop the argument", where, fmt.Sprint(v), typ, v))
			}
		}
		keys := make([]string, 0, len(q.Args))
		for k := range q.Args {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if hint, ok := reservedArgs[k]; ok {
				errs = append(errs, fmt.Errorf("%s: args %s is set by idemq's topology itself; %s", where, k, hint))
			}
		}
		errs = append(errs, validateArgs(where, q.Args)...)
		switch {
		case q.DLQ == q.Name:
			errs = append(errs, fmt.Errorf("%s: dlq %q is its own name: dead letters would come straight back; name another queue, or dlq: \"-\" for none", where, q.DLQ))
		case q.DLQ != "" && q.DLQ != "-" && queues[q.DLQ]:
			errs = append(errs, fmt.Errorf("%s: dlq %q is a work queue of this topology: dead letters would be consumed as work", where, q.DLQ))
		case q.DLQ != "" && q.DLQ != "-" && strings.HasPrefix(q.DLQ, "amq."):
			errs = append(errs, fmt.Errorf("%s: dlq %q: names starting with \"amq.\" are reserved by the broker", where, q.DLQ))
		}
		p := ForQueue(q)
		if p.DLQ != "" {
			if other, ok := dlqTypes[p.DLQ]; ok && other != p.DLQType {
				errs = append(errs, fmt.Errorf("%s: dlq %q is shared with another queue that declares it %s, this one %s; give both the same dlq_type", where, p.DLQ, other, p.DLQType))
			}
			dlqTypes[p.DLQ] = p.DLQType
		}
		for _, n := range append([]string{p.Queue, p.DLQ}, retryNames(p)...) {
			if err := validateName("queue", n); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
			}
		}
		for _, r := range p.Retries {
			if r.Name == p.DLQ {
				errs = append(errs, fmt.Errorf("%s: dlq %q is one of its retry queues", where, q.DLQ))
			}
		}
	}
	for i, b := range t.Bindings {
		if b.Queue == "" || b.Exchange == "" {
			errs = append(errs, fmt.Errorf("bindings[%d]: exchange and queue are required", i))
			continue
		}
		if !exchanges[b.Exchange] {
			errs = append(errs, fmt.Errorf("binding %s -> %s: exchange %q is not declared", b.Exchange, b.Queue, b.Exchange))
		}
		errs = append(errs, validateArgs(fmt.Sprintf("binding %s -> %s", b.Exchange, b.Queue), b.Args)...)
	}
	return errors.Join(errs...)
}

func retryNames(p Plan) []string {
	out := make([]string, len(p.Retries))
	for i, r := range p.Retries {
		out[i] = r.Name
	}
	return out
}

// Load reads a YAML topology (unknown fields are errors) and validates it.
// Durations are Go durations ("500ms", "1m").
func Load(r io.Reader) (Topology, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return Topology{}, fmt.Errorf("topology: read: %w", err)
	}
	var t Topology
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&t); err != nil && !errors.Is(err, io.EOF) {
		if strings.Contains(err.Error(), "into time.Duration") {
			return Topology{}, fmt.Errorf("topology: parse YAML: %w (a duration needs a unit: write 200ms, 5s, 2m — not 200)", err)
		}
		return Topology{}, fmt.Errorf("topology: parse YAML: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		// A second document ("---") would be silently ignored.
		return Topology{}, errors.New("topology: parse YAML: more than one YAML document (---); put every exchange, queue and binding in one")
	}
	if err := t.Validate(); err != nil {
		return Topology{}, fmt.Errorf("topology: invalid: %w", err)
	}
	return t, nil
}

// LoadFile reads a YAML topology from path.
func LoadFile(path string) (Topology, error) {
	f, err := os.Open(path)
	if err != nil {
		return Topology{}, fmt.Errorf("topology: %w", err)
	}
	defer f.Close()
	return Load(f)
}

// normalise turns YAML values into types the AMQP table encoder accepts.
func normalise(v any) any {
	switch x := v.(type) {
	case int:
		return int64(x)
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case uint:
		return int64(x)
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	case uint64:
		return int64(x)
	case time.Duration:
		return x.Milliseconds()
	case map[string]any:
		t := amqp.Table{}
		for k, e := range x {
			t[k] = normalise(e)
		}
		return t
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalise(e)
		}
		return out
	}
	return v
}

func table(m map[string]any) amqp.Table {
	if len(m) == 0 {
		return nil
	}
	t := amqp.Table{}
	for k, v := range m {
		t[k] = normalise(v)
	}
	return t
}
