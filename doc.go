// Package idemq makes RabbitMQ consumers apply every message's effect exactly
// once, on top of RabbitMQ's at-least-once delivery.
//
// This package holds the vocabulary every layer shares.
//
// # The pipeline
//
// A delivery flows one way: broker → [Consumer] → [Pipeline] → handler. The
// consumer decides the delivery's message ID once ([IDConfig],
// [Delivery.ID]) before anything runs; every layer keys on that value. The
// pipeline is data, with a fixed order:
//
//	Policy      the failure policy (FailurePolicy): decides, never acts
//	Middleware  your layers (metrics, tracing, logging)
//	Guard       the dedup guard (a Layer: dedup.NewGuard)
//	            the handler deadline, then Recover (innermost)
//	Handler     the effect: your handler, or an inbox's
//
// # Decisions, then effects
//
// The handler chain returns an error (nil, [ErrDuplicate], or a failure
// classed by [Permanent], [Reject], [Requeue], [Unavailable]). The failure
// policy turns it into a [Decision] — ack, run again, requeue after a
// delay, publish (a retry, a dead letter) then ack, reject — as a pure
// function of the error, the delivery, the run and its config. The
// consumer's executor carries the decision out (publishes with confirms,
// acks or nacks through the coalescing acker) and counts its [Outcome].
// No layer acks, nacks or counts an outcome by itself.
//
// # The rest
//
//   - [Consumer]: manual acks coalesced into multiple-acks, prefetch, N
//     workers, reconnect with backoff, graceful shutdown, a circuit breaker
//     for dependency outages ([BreakerConfig]), handler deadlines below the
//     broker's consumer_timeout.
//   - [Publisher]: publisher confirms always, mandatory routing, a required
//     stable message ID, retries until confirmed across reconnects. It is
//     a [Sender], the interface the failure policy and the Bloom router
//     publish through.
//   - Wire header names (headers.go) and counter names (counters.go),
//     defined once.
//
// # Where things are
//
// config.go holds every configuration ([ConsumerConfig], [BreakerConfig],
// [ReleaseConfig], [PublisherConfig]); errors.go the error classes. The
// consumer's methods are in consumer.go (construction, Run),
// consumer_session.go (one connection's lifetime) and consumer_process.go
// (one delivery: expiry, the decision loop, the handler deadline); the
// executor that settles every delivery is in settle.go. The machinery
// behind them is internal, one package per part: internal/breaker (the
// circuit breaker and asking the dependencies), internal/deadline (the
// handler deadline and the long-running handler watchdog),
// internal/deliverylimit (the queue's delivery limit and consumer timeout
// from the management API), internal/failover (broker URL lists and
// redacted dialing), internal/frame (content header frame sizing),
// internal/acker (coalesced acks, delayed requeues) and internal/release
// (releasing delay queues).
//
// The layers of defence live in their own packages: dedup (the consumer-entry
// guard and its stores), inbox (the effect inside the business transaction),
// outbox (the transactional producer), retry (the failure policy: delays and
// dead letters) and topology. backoff is the one backoff type.
package idemq
