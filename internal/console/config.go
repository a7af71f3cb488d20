package console

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/idemq/idemq/deadletter"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/topology"
)

// DefaultListen is the default listen address: loopback only.
const DefaultListen = "127.0.0.1:8080"

// ErrTokenRequired: the console would listen beyond loopback without a
// token.
var ErrTokenRequired = errors.New("console: a token is required to listen on an address other than loopback")

// Config configures a [Server]. The zero value with AMQPURL and Queues set
// is usable.
type Config struct {
	// Listen is the address served. Default DefaultListen (loopback). Any
	// address that is not loopback (including ":8080", every interface)
	// needs a Token.
	Listen string
	// Token, when set, must come with every request. Required beyond
	// loopback.
	Token string
	// ReadOnly refuses every state change.
	ReadOnly bool
	// AMQPURL is the broker. Required. Rendered only redacted.
	AMQPURL string
	// Queues are the work queues and dead-letter queues the console shows
	// ([QueueOf] makes one from a name). At least one.
	Queues []Queue
	// Keys is the dedup store of the keys page (nil: no keys page).
	Keys dedup.KeyAdmin
	// KeyPrefix is the dedup guard's key prefix (dedup.Config.Prefix).
	// Default "idemq".
	KeyPrefix string
	// Outbox is the outbox of the outbox page (nil: no outbox page).
	Outbox Outbox
	// Publisher republishes replays and archive copies. Default: an
	// idemq.Publisher on AMQPURL, closed with the server.
	Publisher deadletter.Publisher
	// SampleInterval is the live page's sampling interval. Default 2s.
	SampleInterval time.Duration
	// SampleWindow is how much history the live page keeps. Default 10m.
	SampleWindow time.Duration
	// ScanLimit bounds the dead letters read to group a queue. Default
	// 10000.
	ScanLimit int
	// Secrets are scrubbed from every text rendered (passwords of the URLs
	// and DSNs in use), on top of the structural redaction.
	Secrets []string
	// Logger receives one line per action and refusal. Default
	// slog.Default().
	Logger *slog.Logger
}

// IsLoopback reports whether listen address addr (host:port) is on
// loopback only: 127.0.0.0/8, ::1 or "localhost". An empty host (every
// interface) is not.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Validate checks cfg (after defaults).
func (c *Config) Validate() error {
	var errs []error
	if c.AMQPURL == "" {
		errs = append(errs, errors.New("console: AMQPURL is required"))
	}
	if len(c.Queues) == 0 {
		errs = append(errs, errors.New("console: name at least one queue"))
	}
	for _, q := range c.Queues {
		if q.Work == "" || q.DLQ == "" || q.Work == q.DLQ {
			errs = append(errs, fmt.Errorf("console: queue %+v: want a work queue and its dead-letter queue", q))
		}
	}
	listen := c.Listen
	if listen == "" {
		listen = DefaultListen
	}
	if _, _, err := net.SplitHostPort(listen); err != nil {
		errs = append(errs, fmt.Errorf("console: listen address %q: %w", listen, err))
	} else if !IsLoopback(listen) && c.Token == "" {
		errs = append(errs, fmt.Errorf("%w (%s): set a token", ErrTokenRequired, listen))
	}
	if c.Token != "" && len(c.Token) < 16 {
		errs = append(errs, errors.New("console: the token must be at least 16 characters"))
	}
	if c.SampleInterval < 0 || c.SampleWindow < 0 || c.ScanLimit < 0 {
		errs = append(errs, errors.New("console: SampleInterval, SampleWindow and ScanLimit must be >= 0"))
	}
	return errors.Join(errs...)
}

func (c *Config) defaults() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.KeyPrefix == "" {
		c.KeyPrefix = "idemq"
	}
	if c.SampleInterval == 0 {
		c.SampleInterval = 2 * time.Second
	}
	if c.SampleWindow == 0 {
		c.SampleWindow = 10 * time.Minute
	}
	if c.ScanLimit == 0 {
		c.ScanLimit = 10000
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Queue is a work queue and its dead-letter queue. A replay goes to Work.
type Queue struct{ Work, DLQ string }

// QueueOf is the queue pair of name: a work queue ("orders": orders and
// orders.dlq), or a dead-letter queue by the topology convention
// ("orders.dlq").
func QueueOf(name string) Queue {
	if w, ok := deadletter.WorkQueue(name); ok {
		return Queue{Work: w, DLQ: name}
	}
	return Queue{Work: name, DLQ: topology.DLQName(name)}
}

type queuePair = Queue

func pairOf(name string) queuePair { return QueueOf(name) }
