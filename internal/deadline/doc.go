// Package deadline bounds how long the consumer's handlers run: the
// handler's context under its deadline (made lazily, one allocation per
// delivery), the bounds themselves (HandlerTimeout, and the broker's
// consumer_timeout less a margin, counted from a delivery's receipt), and
// the watchdog that logs handlers running long.
//
// RabbitMQ closes a channel (PRECONDITION_FAILED, "delivery acknowledgement
// timed out") when one of its deliveries stays unacknowledged for longer
// than consumer_timeout, and redelivers every unacked delivery of that
// channel — while the first handler may still run. The consumer bounds each
// handler below that timeout, so a slow handler is cancelled and its
// delivery given back through the failure policy before the broker acts.
// The user-facing contract is idemq.ConsumerConfig's HandlerTimeout,
// ConsumerTimeout, ConsumerTimeoutMargin and StuckHandlerAfter.
package deadline
