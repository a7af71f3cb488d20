// Package idemq makes RabbitMQ consumers apply every message's effect exactly
// once, on top of RabbitMQ's at-least-once delivery.
//
// This package holds the vocabulary every layer shares:
//
//   - [Delivery], [Handler], [Middleware]: a delivery flows one way, broker →
//     [Consumer] → middleware chain → handler, and the ack decision (the
//     handler's returned error) flows back up the same chain. No layer acks or
//     nacks by itself.
//   - [Consumer]: manual acks coalesced into multiple-acks, prefetch, N
//     workers, reconnect with backoff, graceful shutdown.
//   - [Publisher]: publisher confirms always, mandatory routing, a required
//     stable message ID, retries until confirmed across reconnects.
//   - The error classes a handler or a middleware returns to say what should
//     happen to a delivery: [Permanent], [Reject], [Requeue].
//
// The layers of defence live in their own packages: dedup (the consumer-entry
// guard and its stores), inbox (the effect inside the business transaction),
// outbox (the transactional producer), retry (delays and dead letters) and
// topology.
package idemq
