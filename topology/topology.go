package topology

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gopkg.in/yaml.v3"
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
	// RetryDelays are the delays of the retry queues, in attempt order.
	// Default [DefaultRetryDelays]. Rounded to whole milliseconds.
	RetryDelays []time.Duration `yaml:"retry_delays" json:"retry_delays,omitempty"`
	// NoRetry declares no retry queues.
	NoRetry bool `yaml:"no_retry" json:"no_retry,omitempty"`
	// Args are extra work-queue arguments (they must not contradict the
	// ones computed here).
	Args map[string]any `yaml:"args" json:"args,omitempty"`
}

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
)

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
	DLQArgs       amqp.Table
	DeliveryLimit int             // effective x-delivery-limit (0: none)
	Delays        []time.Duration // in attempt order (may repeat)
	Retries       []RetryQueue    // one per distinct delay, ascending
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
	p := Plan{Queue: q.Name, Type: typ, Args: amqp.Table{ArgQueueType: string(typ)}}
	for k, v := range q.Args {
		p.Args[k] = normalise(v)
	}
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
		p.DLQArgs = amqp.Table{ArgQueueType: string(Classic)}
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
		}
	}
	p.Delays = q.EffectiveDelays()
	seen := map[time.Duration]bool{}
	for _, d := range p.Delays {
		if seen[d] {
			continue
		}
		seen[d] = true
		p.Retries = append(p.Retries, RetryQueue{
			Name:  RetryQueueName(q.Name, d),
			Delay: d,
			Args: amqp.Table{
				ArgQueueType:    string(Classic),
				ArgMessageTTL:   roundMS(d),
				ArgDLX:          "",
				ArgDLRoutingKey: q.Name,
			},
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

// Validate checks names, types and delays.
func (t Topology) Validate() error {
	var errs []error
	exchanges := map[string]bool{"": true, "amq.direct": true, "amq.fanout": true, "amq.topic": true, "amq.headers": true, "amq.match": true}
	for i, e := range t.Exchanges {
		if e.Name == "" {
			errs = append(errs, fmt.Errorf("exchanges[%d]: name is required", i))
		}
		switch e.Type {
		case "", amqp.ExchangeDirect, amqp.ExchangeFanout, amqp.ExchangeTopic, amqp.ExchangeHeaders:
		default:
			errs = append(errs, fmt.Errorf("exchange %q: unknown type %q", e.Name, e.Type))
		}
		exchanges[e.Name] = true
	}
	queues := map[string]bool{}
	for i, q := range t.Queues {
		if q.Name == "" {
			errs = append(errs, fmt.Errorf("queues[%d]: name is required", i))
			continue
		}
		if queues[q.Name] {
			errs = append(errs, fmt.Errorf("queue %q: declared twice", q.Name))
		}
		queues[q.Name] = true
		switch q.Type {
		case "", Classic, Quorum:
		default:
			errs = append(errs, fmt.Errorf("queue %q: unknown type %q (classic or quorum)", q.Name, q.Type))
		}
		for _, d := range q.RetryDelays {
			if d <= 0 {
				errs = append(errs, fmt.Errorf("queue %q: retry delay %v must be positive", q.Name, d))
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
	}
	return errors.Join(errs...)
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
		return Topology{}, fmt.Errorf("topology: parse YAML: %w", err)
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
