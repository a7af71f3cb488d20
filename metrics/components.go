package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
)

// PublisherRecorder is the [idemq.Recorder] of a publisher
// (PublisherConfig.Recorder): confirms, returns, retries, reconnects and
// in-flight confirms, labelled publisher=name.
type PublisherRecorder struct {
	confirms, returns, retries, reconnects prometheus.Counter
	inflight                               prometheus.Gauge
	events                                 func(string) prometheus.Counter
}

// Publisher returns the recorder of the publisher called name (a bounded
// name: the service or the target, never a message ID).
func (m *Metrics) Publisher(name string) *PublisherRecorder {
	return &PublisherRecorder{
		confirms:   m.pubConfirms.WithLabelValues(name),
		returns:    m.pubReturns.WithLabelValues(name),
		retries:    m.pubRetries.WithLabelValues(name),
		reconnects: m.pubReconnects.WithLabelValues(name),
		inflight:   m.pubInFlight.WithLabelValues(name),
		events:     func(e string) prometheus.Counter { return m.events.WithLabelValues("", "publisher:"+name, e) },
	}
}

// Add implements [idemq.Recorder].
func (r *PublisherRecorder) Add(name string, delta int64) {
	switch name {
	case idemq.CountPublished:
		r.confirms.Add(float64(delta))
	case idemq.CountPublishReturned:
		r.returns.Add(float64(delta))
	case idemq.CountPublishRetries:
		r.retries.Add(float64(delta))
	case idemq.CountReconnects:
		r.reconnects.Add(float64(delta))
	case idemq.GaugePublishInFlight:
		r.inflight.Add(float64(delta))
	default:
		if delta > 0 {
			r.events(name).Add(float64(delta))
		}
	}
}

// RelayRecorder is the [idemq.Recorder] of an outbox relay
// (outbox.RelayConfig.Recorder), labelled relay=name.
type RelayRecorder struct {
	published, failed, retried, purged, errors prometheus.Counter
	pending, blocked, lag                      prometheus.Gauge
	events                                     func(string) prometheus.Counter
}

// Relay returns the recorder of the relay called name (its outbox table
// or service).
func (m *Metrics) Relay(name string) *RelayRecorder {
	return &RelayRecorder{
		published: m.relayPublished.WithLabelValues(name),
		failed:    m.relayFailed.WithLabelValues(name),
		retried:   m.relayRetried.WithLabelValues(name),
		purged:    m.relayPurged.WithLabelValues(name),
		errors:    m.relayErrors.WithLabelValues(name),
		pending:   m.relayPending.WithLabelValues(name),
		blocked:   m.relayBlocked.WithLabelValues(name),
		lag:       m.relayLag.WithLabelValues(name),
		events:    func(e string) prometheus.Counter { return m.events.WithLabelValues("", "relay:"+name, e) },
	}
}

// Add implements [idemq.Recorder]. The relay records its gauges as deltas.
func (r *RelayRecorder) Add(name string, delta int64) {
	f := float64(delta)
	switch name {
	case outbox.CountRelayPublished:
		r.published.Add(f)
	case outbox.CountRelayFailed:
		r.failed.Add(f)
	case outbox.CountRelayRetried:
		r.retried.Add(f)
	case outbox.CountRelayPurged:
		r.purged.Add(f)
	case outbox.CountRelayErrors:
		r.errors.Add(f)
	case outbox.GaugePending:
		r.pending.Add(f)
	case outbox.GaugeBlocked:
		r.blocked.Add(f)
	case outbox.GaugeLagMillis:
		r.lag.Add(f / 1000)
	default:
		if delta > 0 {
			r.events(name).Add(f)
		}
	}
}
