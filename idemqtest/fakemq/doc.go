// Package fakemq is an in-memory RabbitMQ for tests: an AMQP 0-9-1 broker
// that speaks the wire protocol to amqp091-go over an in-process pipe, so
// an idemq Consumer and Publisher — and any code on *amqp.Channel — run on
// it unchanged, in a plain `go test`, with no server:
//
//	b := fakemq.New(fakemq.Config{})
//	defer b.Close()
//	c, err := idemq.NewConsumer(idemq.ConsumerConfig{URL: "amqp://fake/", Dial: b.Dial, …})
//
// # What it models (as RabbitMQ 3.10 does)
//
//   - Connections, channels, SASL PLAIN/AMQPLAIN (any credentials pass),
//     heartbeats, frame size, content split over frames.
//   - Exchanges: the default exchange, direct, fanout and topic (with
//     amq.direct, amq.fanout, amq.topic), declare (passive too), delete,
//     auto-delete; queue bind and unbind.
//   - Classic and quorum queues: declare (passive, server-named,
//     exclusive, auto-delete), inequivalent redeclaration (406), purge,
//     delete (its consumers get a basic.cancel).
//   - basic.consume, cancel, get; prefetch (basic.qos per consumer, or
//     global per channel); delivery tags per channel; ack, nack, reject,
//     single and multiple; an unknown tag closes the channel (406).
//   - Requeue (nack/reject with requeue, a channel or connection closed
//     with unacked deliveries, basic.recover): the message goes back to its
//     place in the queue, Redelivered set.
//   - Quorum queues: x-delivery-count on a message given back, and
//     x-delivery-limit: past it the message is dead-lettered
//     (delivery_limit).
//   - Dead-lettering (x-dead-letter-exchange, x-dead-letter-routing-key) on
//     reject without requeue, expiry and the delivery limit, with x-death
//     (one entry per queue and reason, counted, newest first,
//     original-expiration) and x-first-death-*; a dead-letter cycle
//     without a rejection drops the message.
//   - TTL: x-message-ttl and per-message expiration, a message expiring
//     when it reaches the head of its queue, in real time (use short
//     delays in tests).
//   - Publisher confirms (every publish acked once routed) and mandatory
//     returns (312 NO_ROUTE, then the ack); a publish to a missing exchange
//     closes the channel (404).
//   - Faults: [Broker.DropConnections] cuts every connection as a network
//     failure does (unacked deliveries come back redelivered).
//
// The comparison test (compare_test.go) runs each of these scenarios on the
// fake and on a real RabbitMQ and requires the same transcript: delivery
// tags, redelivered flags, ready counts, headers with their wire types,
// reply codes.
//
// # What it does not
//
// Persistence and broker restarts (nothing survives Close), clustering and
// quorum leader changes, users, permissions and virtual hosts (one vhost,
// every login accepted), the consumer timeout (delivery_acknowledgement_timeout),
// x-max-length and the other queue limits (declaring one fails with 540
// rather than be silently ignored), x-expires, priorities, headers
// exchanges, exchange-to-exchange bindings, transactions, streams, flow
// control and connection.blocked, nacked publishes (the fake confirms
// every publish), alternate exchanges, the RabbitMQ 4.x changes to x-death
// and quorum queues (default delivery limit, requeue order). Message order
// after a requeue follows the original enqueue order (classic queue
// behaviour); a quorum queue on RabbitMQ may differ.
package fakemq
