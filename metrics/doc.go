// Package metrics exports idemq's counters, outcomes and latencies to
// Prometheus, and serves /metrics, /healthz and /readyz.
//
// One [Metrics] per process owns the collectors. Hand out recorders from
// it, one per component, labelled by queue and consumer group (never by
// message ID: every label takes a bounded set of values):
//
//	m, _ := metrics.New(metrics.Config{})
//	rec := m.Consumer("orders", "billing")           // an idemq.Observer
//	c, _ := idemq.NewConsumer(idemq.ConsumerConfig{Queue: "orders", Group: "billing", Recorder: rec, ...})
//	rec.Watch(c)                                     // breaker state, readiness
//	pub, err := idemq.NewPublisher(idemq.PublisherConfig{Recorder: m.Publisher("orders")})
//	store := m.Store("redis", redisStore)            // dedup store latency and errors by op
//	m.Bloom("orders", filter)                        // fill and estimated FP rate, read at scrape
//	ib, _ := inbox.New(ctx, db, inbox.Config{Observer: m.Inbox("orders")}) // transactions, batches, fallbacks
//	http.ListenAndServe(addr, metrics.NewHealth(metrics.HealthConfig{Gatherer: m.Gatherer(),
//		Checks: map[string]metrics.Check{"consumer": metrics.ConsumerReady(c)}}))
//
// The consumer counts outcomes from the decision it carried out
// ([idemq.Observer]); the layers' own counters ([idemq.Recorder] names)
// become typed metrics where this package knows them (leases lost,
// publisher confirms, outbox gauges) and idemq_events_total{event} else.
// See docs/OBSERVABILITY.md for the metric table.
package metrics
