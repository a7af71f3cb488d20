package metrics

import (
	"errors"
	"net/http"
	"regexp"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemq/idemq"
)

// Config configures [New]. The zero value is usable.
type Config struct {
	// Registerer is where the collectors are registered. Default: a new
	// registry of the Metrics' own ([Metrics.Gatherer]), with the Go and
	// process collectors.
	Registerer prometheus.Registerer
	// Gatherer serves /metrics ([Metrics.Handler]). Default: the new
	// registry; required with a Registerer that is not a Gatherer.
	Gatherer prometheus.Gatherer
	// Namespace prefixes every metric name. Default "idemq".
	Namespace string
	// DurationBuckets are the handler-duration, overhead and store-latency
	// buckets, in seconds. Default 0.5ms … 10s.
	DurationBuckets []float64
	// CriticalTimeBuckets are the end-to-end (publish → settled) buckets,
	// in seconds. Default 5ms … 1h.
	CriticalTimeBuckets []float64
}

// ErrInvalidConfig is wrapped by every error [Config.Validate] returns,
// and by New's for a configuration it cannot use.
var ErrInvalidConfig = idemq.ConfigErrorClass("metrics: invalid config")

var namespaceRe = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// Validate reports a namespace Prometheus does not accept, or a Registerer
// without a Gatherer.
func (c Config) Validate() error {
	if c.Namespace != "" && !namespaceRe.MatchString(c.Namespace) {
		return errors.Join(ErrInvalidConfig, errors.New("namespace "+c.Namespace+" is not a metric name"))
	}
	if c.Registerer != nil && c.Gatherer == nil {
		if _, ok := c.Registerer.(prometheus.Gatherer); !ok {
			return errors.Join(ErrInvalidConfig, errors.New("a Registerer that is not a Gatherer needs Config.Gatherer"))
		}
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Registerer == nil {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		c.Registerer, c.Gatherer = reg, reg
	}
	if c.Gatherer == nil {
		c.Gatherer = c.Registerer.(prometheus.Gatherer)
	}
	if c.Namespace == "" {
		c.Namespace = "idemq"
	}
	if len(c.DurationBuckets) == 0 {
		c.DurationBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
	}
	if len(c.CriticalTimeBuckets) == 0 {
		c.CriticalTimeBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
	}
	return c
}

// Metrics owns idemq's collectors. Create it with [New]; it is safe for
// concurrent use.
type Metrics struct {
	cfg Config

	// consumer side, labels queue, group (+ one of its own)
	deliveries  *prometheus.CounterVec   // outcome
	settled     *prometheus.CounterVec   // action
	duplicates  *prometheus.CounterVec   // layer
	deadLetters *prometheus.CounterVec   // reason
	received    *prometheus.CounterVec   //
	redelivered *prometheus.CounterVec   //
	leasesLost  *prometheus.CounterVec   //
	reconnects  *prometheus.CounterVec   //
	events      *prometheus.CounterVec   // event
	unacked     *prometheus.GaugeVec     //
	handlerDur  *prometheus.HistogramVec //
	criticalDur *prometheus.HistogramVec //
	overheadDur *prometheus.HistogramVec //
	forwardDur  *prometheus.HistogramVec // gate

	// publisher, label publisher
	pubConfirms   *prometheus.CounterVec
	pubReturns    *prometheus.CounterVec
	pubRetries    *prometheus.CounterVec
	pubReconnects *prometheus.CounterVec
	pubInFlight   *prometheus.GaugeVec

	// outbox relay, label relay
	relayPublished *prometheus.CounterVec
	relayFailed    *prometheus.CounterVec
	relayRetried   *prometheus.CounterVec
	relayPurged    *prometheus.CounterVec
	relayErrors    *prometheus.CounterVec
	relayPending   *prometheus.GaugeVec
	relayBlocked   *prometheus.GaugeVec
	relayLag       *prometheus.GaugeVec

	// dedup store, labels store, op
	storeDur    *prometheus.HistogramVec
	storeErrors *prometheus.CounterVec
	storeBatch  *prometheus.HistogramVec

	// inbox, label inbox (+ path, result)
	inboxTxDur     *prometheus.HistogramVec // path
	inboxTx        *prometheus.CounterVec   // path, result
	inboxBatch     *prometheus.HistogramVec //
	inboxFallbacks *prometheus.CounterVec   //

	mu        sync.Mutex
	consumers map[[2]string]*ConsumerRecorder
	watched   *stateCollector
	bloom     *bloomCollector
}

// New validates cfg, fills its defaults and registers the collectors.
func New(cfg Config) (*Metrics, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	ns := cfg.Namespace
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, labels)
	}
	gv := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: name, Help: help}, labels)
	}
	hv := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: name, Help: help, Buckets: buckets}, labels)
	}
	qg := []string{"queue", "group"}
	with := func(extra string) []string { return []string{"queue", "group", extra} }
	m := &Metrics{
		cfg:         cfg,
		deliveries:  cv("deliveries_total", "Deliveries settled, by outcome (processed, duplicate, retried, deferred, unavailable, stopped, dead_lettered, rejected, routed).", with("outcome")...),
		settled:     cv("settlements_total", "Deliveries settled, by what was done to them (acked, requeued, rejected, republished).", with("action")...),
		duplicates:  cv("duplicates_total", "Duplicates suppressed, by the layer that recognised them (guard, inbox, bloom).", with("layer")...),
		deadLetters: cv("dead_lettered_total", "Deliveries dead-lettered, by reason.", with("reason")...),
		received:    cv("received_total", "Deliveries received from the broker.", qg...),
		redelivered: cv("redelivered_total", "Deliveries received with the redelivered flag.", qg...),
		leasesLost:  cv("leases_lost_total", "Dedup leases lost while the handler ran or at complete.", qg...),
		reconnects:  cv("reconnects_total", "Consumer connections re-established.", qg...),
		events:      cv("events_total", "Other idemq counters (idemq.Count* names), by name.", with("event")...),
		unacked:     gv("unacked_deliveries", "Deliveries received and not yet settled (in the consumer's hands).", qg...),
		handlerDur:  hv("handler_duration_seconds", "Time spent in the handler chain per delivery (every run).", cfg.DurationBuckets, qg...),
		criticalDur: hv("critical_time_seconds", "End-to-end time from the message's AMQP timestamp to its settlement (1s resolution of the timestamp).", cfg.CriticalTimeBuckets, qg...),
		overheadDur: hv("overhead_seconds", "Time in the consumer outside the handler chain: queued for a worker, settling, republishing.", cfg.DurationBuckets, qg...),
		forwardDur:  hv("gate_forward_seconds", "Gate: receipt to the confirm of the last route.", cfg.DurationBuckets, qg...),

		pubConfirms:   cv("publisher_confirms_total", "Publishes confirmed by the broker.", "publisher"),
		pubReturns:    cv("publisher_returns_total", "Publishes returned unroutable.", "publisher"),
		pubRetries:    cv("publisher_retries_total", "Publish attempts resent.", "publisher"),
		pubReconnects: cv("publisher_reconnects_total", "Publisher connections re-established.", "publisher"),
		pubInFlight:   gv("publisher_inflight", "Publishes waiting for their confirm.", "publisher"),

		relayPublished: cv("outbox_published_total", "Outbox rows confirmed and marked sent.", "relay"),
		relayFailed:    cv("outbox_failed_total", "Outbox rows marked failed.", "relay"),
		relayRetried:   cv("outbox_retried_total", "Outbox rows released for a later attempt.", "relay"),
		relayPurged:    cv("outbox_purged_total", "Sent outbox rows deleted after the retention.", "relay"),
		relayErrors:    cv("outbox_store_errors_total", "Outbox store calls that failed.", "relay"),
		relayPending:   gv("outbox_pending", "Pending outbox rows.", "relay"),
		relayBlocked:   gv("outbox_blocked", "Pending outbox rows held back by a failed row of their ordering key.", "relay"),
		relayLag:       gv("outbox_lag_seconds", "Age of the oldest pending outbox row.", "relay"),

		storeDur:    hv("dedup_store_seconds", "Dedup store call latency, by operation.", cfg.DurationBuckets, "store", "op"),
		storeErrors: cv("dedup_store_errors_total", "Dedup store calls that failed (lease lost excluded), by operation.", "store", "op"),
		storeBatch:  hv("dedup_store_batch_size", "Requests per batched dedup store call.", []float64{1, 2, 5, 10, 20, 50, 100, 200}, "store", "op"),

		inboxTxDur:     hv("inbox_transaction_seconds", "Inbox transaction latency, begin to the end of commit or rollback, by path (single, batch, savepoints).", cfg.DurationBuckets, "inbox", "path"),
		inboxTx:        cv("inbox_transactions_total", "Inbox transactions, by path and result (committed, rolled_back, failed).", "inbox", "path", "result"),
		inboxBatch:     hv("inbox_batch_size", "Deliveries per inbox batch transaction.", []float64{1, 2, 5, 10, 20, 50, 100, 200, 500}, "inbox"),
		inboxFallbacks: cv("inbox_savepoint_fallbacks_total", "Inbox batches whose fast path rolled back and ran again with a savepoint per delivery.", "inbox"),

		consumers: map[[2]string]*ConsumerRecorder{},
	}
	m.watched = &stateCollector{
		breaker: prometheus.NewDesc(ns+"_breaker_open", "1 while the consumer's circuit breaker holds deliveries back (a dependency is down).", qg, nil),
		ready:   prometheus.NewDesc(ns+"_consumer_ready", "1 once the consumer has subscribed.", qg, nil),
	}
	m.bloom = &bloomCollector{
		fill: prometheus.NewDesc(ns+"_bloom_fill_ratio", "Fill ratio of each Bloom filter generation (0 = newest).", []string{"filter", "generation"}, nil),
		fp:   prometheus.NewDesc(ns+"_bloom_estimated_fp_rate", "Estimated false-positive rate of a Bloom lookup now.", []string{"filter"}, nil),
		want: prometheus.NewDesc(ns+"_bloom_target_fp_rate", "The false-positive rate the Bloom filter was sized for.", []string{"filter"}, nil),
		size: prometheus.NewDesc(ns+"_bloom_bytes", "Memory the Bloom bitmaps hold.", []string{"filter"}, nil),
		errs: prometheus.NewDesc(ns+"_bloom_stats_errors", "1 when the last read of the filter's stats failed.", []string{"filter"}, nil),
	}
	cs := []prometheus.Collector{m.deliveries, m.settled, m.duplicates, m.deadLetters, m.received, m.redelivered,
		m.leasesLost, m.reconnects, m.events, m.unacked, m.handlerDur, m.criticalDur, m.overheadDur, m.forwardDur,
		m.pubConfirms, m.pubReturns, m.pubRetries, m.pubReconnects, m.pubInFlight,
		m.relayPublished, m.relayFailed, m.relayRetried, m.relayPurged, m.relayErrors, m.relayPending, m.relayBlocked, m.relayLag,
		m.storeDur, m.storeErrors, m.storeBatch,
		m.inboxTxDur, m.inboxTx, m.inboxBatch, m.inboxFallbacks, m.watched, m.bloom}
	for _, c := range cs {
		if err := cfg.Registerer.Register(c); err != nil {
			return nil, errors.Join(ErrInvalidConfig, err)
		}
	}
	return m, nil
}

// Gatherer returns what serves /metrics.
func (m *Metrics) Gatherer() prometheus.Gatherer { return m.cfg.Gatherer }

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.cfg.Gatherer, promhttp.HandlerOpts{})
}
