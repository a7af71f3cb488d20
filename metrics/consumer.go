package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemq/idemq"
)

// ConsumerRecorder is the [idemq.Observer] of one consumer (queue, group):
// set it as ConsumerConfig.Recorder (or gate.Config.Recorder). It counts
// outcomes from the decision the consumer carried out, observes handler,
// overhead and critical-time durations, and maps the layers' counters to
// typed metrics. Get it from [Metrics.Consumer].
type ConsumerRecorder struct {
	m            *Metrics
	queue, group string

	outcomes   [idemq.OutcomeRouted + 1]prometheus.Counter
	actions    [idemq.ActionReject + 1]prometheus.Counter
	received   prometheus.Counter
	redeliv    prometheus.Counter
	leasesLost prometheus.Counter
	reconnects prometheus.Counter
	unacked    prometheus.Gauge
	handler    prometheus.Observer
	critical   prometheus.Observer
	overhead   prometheus.Observer
	forward    prometheus.Observer

	extra sync.Map // label value (event, layer, reason) → prometheus.Counter, per vec
}

var (
	_ idemq.Observer = (*ConsumerRecorder)(nil)
)

var outcomeLabels = map[idemq.Outcome]string{
	idemq.OutcomeProcessed: "processed", idemq.OutcomeDuplicate: "duplicate", idemq.OutcomeRetried: "retried",
	idemq.OutcomeDeferred: "deferred", idemq.OutcomeUnavailable: "unavailable", idemq.OutcomeStopped: "stopped",
	idemq.OutcomeDeadLettered: "dead_lettered", idemq.OutcomeRejected: "rejected", idemq.OutcomeRouted: "routed",
}

var actionLabels = map[idemq.Action]string{
	idemq.ActionAck: "acked", idemq.ActionRequeue: "requeued", idemq.ActionPublish: "republished", idemq.ActionReject: "rejected",
}

// Consumer returns the recorder of the consumer of queue in group (group
// defaults to queue, as in idemq.ConsumerConfig). The same pair returns
// the same recorder.
func (m *Metrics) Consumer(queue, group string) *ConsumerRecorder {
	if group == "" {
		group = queue
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.consumers[[2]string{queue, group}]; ok {
		return r
	}
	r := &ConsumerRecorder{m: m, queue: queue, group: group,
		received:   m.received.WithLabelValues(queue, group),
		redeliv:    m.redelivered.WithLabelValues(queue, group),
		leasesLost: m.leasesLost.WithLabelValues(queue, group),
		reconnects: m.reconnects.WithLabelValues(queue, group),
		unacked:    m.unacked.WithLabelValues(queue, group),
		handler:    m.handlerDur.WithLabelValues(queue, group),
		critical:   m.criticalDur.WithLabelValues(queue, group),
		overhead:   m.overheadDur.WithLabelValues(queue, group),
		forward:    m.forwardDur.WithLabelValues(queue, group),
	}
	for o, l := range outcomeLabels {
		r.outcomes[o] = m.deliveries.WithLabelValues(queue, group, l)
	}
	for a, l := range actionLabels {
		r.actions[a] = m.settled.WithLabelValues(queue, group, l)
	}
	m.consumers[[2]string{queue, group}] = r
	return r
}

// Settled implements [idemq.Observer].
func (r *ConsumerRecorder) Settled(d *idemq.Delivery, s idemq.Settlement) {
	dec := s.Decision
	r.unacked.Dec()
	if int(dec.Outcome) < len(r.outcomes) && r.outcomes[dec.Outcome] != nil {
		r.outcomes[dec.Outcome].Inc()
	}
	if int(dec.Action) < len(r.actions) && r.actions[dec.Action] != nil {
		r.actions[dec.Action].Inc()
	}
	switch dec.Outcome {
	case idemq.OutcomeDuplicate:
		layer := dec.Reason
		if layer == "" {
			layer = "unknown"
		}
		r.labelled(r.m.duplicates, layer).Inc()
	case idemq.OutcomeDeadLettered:
		if dec.Action == idemq.ActionPublish {
			r.labelled(r.m.deadLetters, reasonLabel(dec.Reason)).Inc()
		}
	}
	if s.Handler > 0 {
		r.handler.Observe(s.Handler.Seconds())
		if o := s.Total - s.Handler; o >= 0 {
			r.overhead.Observe(o.Seconds())
		}
	}
	if !d.Timestamp.IsZero() {
		if ct := time.Since(d.Timestamp); ct >= 0 {
			r.critical.Observe(ct.Seconds())
		}
	}
}

// maxReasonLen bounds a dead-letter reason label; reasons are short
// constants (idemq.Reason*), a longer one is cut.
const maxReasonLen = 64

func reasonLabel(reason string) string {
	if reason == "" {
		return "unknown"
	}
	if len(reason) > maxReasonLen {
		return reason[:maxReasonLen]
	}
	return reason
}

// labelled returns v's child for (queue, group, value), cached.
func (r *ConsumerRecorder) labelled(v *prometheus.CounterVec, value string) prometheus.Counter {
	type key struct {
		v     *prometheus.CounterVec
		value string
	}
	k := key{v, value}
	if c, ok := r.extra.Load(k); ok {
		return c.(prometheus.Counter)
	}
	c := v.WithLabelValues(r.queue, r.group, value)
	r.extra.Store(k, c)
	return c
}

// Add implements [idemq.Recorder]: the layers' counters. Outcome counters
// (processed, duplicates, retried, …) are counted by Settled and skipped
// here.
func (r *ConsumerRecorder) Add(name string, delta int64) {
	switch name {
	case idemq.CountDelivered:
		r.received.Add(float64(delta))
		r.unacked.Add(float64(delta))
	case idemq.CountRedelivered:
		r.redeliv.Add(float64(delta))
	case idemq.CountLeasesLost:
		r.leasesLost.Add(float64(delta))
	case idemq.CountReconnects:
		r.reconnects.Add(float64(delta))
	case idemq.CountAcked, idemq.CountProcessed, idemq.CountDuplicates, idemq.CountRetried,
		idemq.CountDeadLettered, idemq.CountRejected, idemq.CountRequeued, idemq.CountUnavailable:
		// counted from the decision (Settled)
	default:
		if delta > 0 {
			r.labelled(r.m.events, name).Add(float64(delta))
		}
	}
}

// ObserveForward implements gate.LatencyObserver.
func (r *ConsumerRecorder) ObserveForward(d time.Duration) { r.forward.Observe(d.Seconds()) }

// Watch exports the consumer's breaker state and readiness
// (idemq_breaker_open, idemq_consumer_ready), read at each scrape.
func (r *ConsumerRecorder) Watch(c Watched) {
	r.m.watched.add(r.queue, r.group, c)
}

// Watched is what [ConsumerRecorder.Watch] reads: *idemq.Consumer.
type Watched interface {
	Ready() <-chan struct{}
	Paused() bool
}

// stateCollector reads the watched consumers at scrape time.
type stateCollector struct {
	breaker, ready *prometheus.Desc
	mu             sync.Mutex
	list           []watchedConsumer
}

type watchedConsumer struct {
	queue, group string
	c            Watched
}

func (s *stateCollector) add(queue, group string, c Watched) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, w := range s.list {
		if w.queue == queue && w.group == group {
			s.list[i].c = c
			return
		}
	}
	s.list = append(s.list, watchedConsumer{queue, group, c})
}

func (s *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- s.breaker; ch <- s.ready }

func (s *stateCollector) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	list := append([]watchedConsumer(nil), s.list...)
	s.mu.Unlock()
	for _, w := range list {
		ch <- prometheus.MustNewConstMetric(s.breaker, prometheus.GaugeValue, b2f(w.c.Paused()), w.queue, w.group)
		ch <- prometheus.MustNewConstMetric(s.ready, prometheus.GaugeValue, b2f(isReady(w.c)), w.queue, w.group)
	}
}

func isReady(c Watched) bool {
	select {
	case <-c.Ready():
		return true
	default:
		return false
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
