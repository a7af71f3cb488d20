// Package mgmt reads what AMQP cannot tell about a queue from the RabbitMQ
// management HTTP API (the rabbitmq_management plugin): the delivery limit
// the broker applies to a quorum queue.
//
// A passive queue.declare returns no arguments, and a limit set by a
// policy or an operator policy (the `delivery-limit` key) is not visible
// over AMQP at all. The management API shows all three sources on
// GET /api/queues/{vhost}/{name}: `arguments["x-delivery-limit"]`, the
// `policy` and `operator_policy` names, and `effective_policy_definition`
// (the policy merged with the operator policy). [Resolve] takes the
// smallest limit that applies, as RabbitMQ does:
//
//   - 3.10–3.13: policy and operator policy are merged with min (the
//     operator policy's merge strategy for delivery-limit), and the merged
//     value and the x-delivery-limit argument are resolved with min again
//     (measured on 3.10.8: argument 5, policy 4, operator policy 3 → 3).
//     No source: no limit.
//   - 4.0 and later: the same, except that a negative value (-1) means
//     "no limit" and yields to any non-negative one, and a quorum queue
//     with no source at all gets the broker's default of 20 (read from
//     RabbitMQ's documentation and source; only 3.10 is tested here).
//
// The management API fills a queue's policy fields from its statistics,
// which it collects every few seconds (collect_statistics_interval, 5 s by
// default): for a queue declared a moment ago they are absent, and
// [Client.Queue] waits for them (within its context) rather than read "no
// policy". A policy changed while a consumer runs shows after the next
// collection; the consumer reads the limit at each (re)connect and every
// ConsumerConfig.ManagementRefresh.
//
// The client authenticates with the URL's user and password (HTTP basic
// auth; the user needs the monitoring tag, or management for its own
// vhosts). Errors name the URL redacted, never with its password.
package mgmt
