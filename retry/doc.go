// Package retry is idemq's failure policy: it decides what happens to a
// delivery whose handler chain failed, without ever looping it through
// nack(requeue=true).
//
// # Decisions, then effects
//
// [Policy] implements idemq.FailurePolicy. Its methods are pure functions
// of the delivery, the run and the config: they return an idemq.Decision
// value and do nothing else. The consumer's executor carries the decision
// out — publishes the message the decision names through the Sender,
// waits for the broker's confirm, then acks the delivery; or nacks it, at
// once or after a delay — and counts the outcome. So the whole policy is
// table-tested without a broker (decide_test.go), and what the broker
// does with each kind of decision is tested against a real one.
//
// Decide, after a run of the handler chain:
//
//	nil, idemq.ErrDuplicate       → ack
//	a dependency unavailable      → given back in place after its After
//	(idemq.IsUnavailable)           (UnavailableRetryAfter by default), not an
//	                                attempt: x-idemq-attempt unchanged, no
//	                                quick retry, never dead-lettered
//	any other error, run <        → run the chain again after QuickBackoff
//	QuickAttempts                   (in process)
//	the consumer is stopping      → given back at once (no decision now)
//	idemq.Permanent / Reject      → dead-letter queue with the error's reason
//	                                (permanent, missing-id, invalid-id,
//	                                unparseable, …)
//	*idemq.RequeueError           → a deferral, not an attempt (see below)
//	attempt >= MaxAttempts, or    → dead-letter queue, reason max-attempts
//	no Delays
//	otherwise                     → the retry queue of this attempt, with
//	                                x-idemq-attempt = attempt+1
//
// Admit, before the chain runs, drops forged headers (below),
// dead-letters a held dead letter (below) and dead-letters, with reason
// delivery-limit, a delivery whose x-delivery-count reached DeliveryLimit,
// or the lower limit the broker applies (quorum queues count
// redeliveries after crashes and requeues; the policy acts one delivery
// before the broker would drop the message without idemq's headers).
//
// PublishFailed, when the executor could not publish what a decision said:
//
//	retry, unpublishable (retry   → dead-letter queue, reason handler-error
//	queue missing, headers
//	invalid or too large)
//	dead letter too large         → the same dead letter with only the
//	                                message's own headers, x-idemq-reason and
//	                                x-idemq-attempts
//	dead letter unroutable        → held back: republished, marked
//	(DLQ deleted, or a classic      x-idemq-dead-letter-held, to a retry queue
//	DLQ whose node is down)         (the work queue when that is gone too);
//	                                Admit dead-letters it again when it comes
//	                                back, before the handler runs, until the
//	                                DLQ routes (counter retry_dead_letter_held)
//	dead letter unpublishable     → rejected to the broker (nack without
//	(still too large, invalid)      requeue: its dead-letter exchange, if any,
//	                                takes it), counter retry_unpublishable
//	deferral, any failure         → waits in place for its After; the layer
//	                                that deferred it decides again
//	anything else (the connection → waits in place PublishRetryAfter, then
//	is down, a confirm timed out)   the decision is taken again
//
// A republish that can never succeed is therefore a permanent failure,
// never a loop; a deferral is never dead-lettered for a failed republish.
// A delivery whose message ID is missing or invalid cannot be retried
// under its own ID (the dedup guard keys on it): it is dead-lettered
// (missing-id / invalid-id), and its dead letter gets a fresh ID with the
// original, if any, in x-idemq-original-message-id. Without a dead-letter
// queue (topology dlq: "-") a delivery that fails for good is rejected to
// the broker (counter retry_no_dlq): no DLQ means no DLQ.
//
// # Order
//
// Every republish is confirmed by the broker BEFORE the delivery is acked.
// A crash in between duplicates a retry or a dead letter (same message ID:
// the dedup guard sees one message); it never loses one. The policy is not
// a middleware: it sits in idemq.Pipeline.Policy, outside every layer, so
// the dedup guard's and the inbox's deferrals and rejections always reach
// it. [New] ([Config.Validate]) refuses, at startup, delays without their
// retry queue and a dead-letter queue the topology does not declare.
//
// # Deferrals
//
// A RequeueError (the dedup guard's store is unavailable, a suspect publish
// failed) is republished to the smallest retry queue whose delay is >=
// After, with x-idemq-requeues incremented and the attempt count
// unchanged, so the consumer's prefetch is not filled with parked
// deliveries and a long outage does not run up the quorum delivery count.
// With InPlace (the guard: another consumer holds the lease, or a lease
// was lost), without a Sender or without retry queues it stays in its
// queue: the consumer nacks it with requeue after After, without holding a
// worker. A requeue counts as a delivery on quorum queues (RabbitMQ 3.x),
// so an in-place deferral whose x-delivery-count has reached half the
// DeliveryLimit is republished (confirmed, then acked) to the work queue
// itself, which starts the count again (it needs no wait, and it stays
// lossless with the at-most-once classic retry queues of retry_type:
// classic). The limit is [Policy.RequeueLimit]: [Config.RequeueLimit] —
// the declared DeliveryLimit, or RabbitMQ 4's default quorum
// delivery-limit of 20 when none is declared ([BrokerDefaultDeliveryLimit])
// — or, when lower, the limit the broker applies to the queue as the
// consumer read it from the management API (idemq.ConsumerConfig's
// ManagementURL, handed over in idemq.Delivery.QueueDeliveryLimit): a
// policy's or an operator policy's delivery-limit, which AMQP cannot show.
// See docs/RABBITMQ_VERSIONS.md. Retry queues are quorum queues with
// at-least-once dead-lettering by default (topology), so a delivery
// waiting in one survives a broker restart.
//
// # Headers
//
// Inbound x-idemq-* headers are trusted only on a delivery that came back
// through idemq's own path ([FromRetryPath]: default exchange, its own
// queue as routing key, and the x-idemq-queue marker with x-idemq-attempt
// or x-idemq-requeues). On any other delivery Admit drops them, so the
// original exchange and routing key recorded are the delivery's own, a
// forged attempt count uses up nothing, and a forged route cannot steer a
// replay. Every x-idemq-* header the policy writes is bounded (the error
// text by ErrorTextLimit, at most [MaxErrorTextLimit]; the others at 255
// bytes), so what it adds stays a few KiB below frame_max. The names are
// idemq.Header* (one file, headers.go in the root package).
//
// Decisions rest on two counters only: x-idemq-attempt, which the policy
// rewrites on every hop (a missing or garbage value counts as attempt 1, so
// it can reset the count at most once), and the broker's own
// x-delivery-count. The broker's x-death header is parsed defensively
// ([ParseXDeath]) for diagnostics and for the CLI; its counts are never
// used to decide.
//
// The message ID, body, content type and headers are kept on every
// republish; the per-message expiration is dropped (it would fire inside a
// retry queue) and the broker's x-delivery-count header is removed.
//
// # Topology
//
// Retry queues are per-delay queues "<queue>.retry.<ms>" with x-message-ttl
// and a dead-letter route back to the work queue; the dead-letter queue is
// "<queue>.dlq". The names and arguments come from the topology package
// ([topology.ForQueue]); use [ForTopology] to configure the policy from the
// same declaration that creates the queues.
//
// Without a Sender the policy degrades: transient errors are still tried
// QuickAttempts times, then every failure is rejected to the broker (nack
// without requeue) — the work queue's dead-letter arguments (topology)
// route it to the dead-letter queue, where the broker's x-death header says
// why.
package retry
