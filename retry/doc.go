// Package retry is idemq's failure policy: a middleware that decides what
// happens to a delivery whose handler failed, without ever looping it through
// nack(requeue=true).
//
//	nil                          → nil (the consumer acks)
//	idemq.Permanent / Reject     → dead-letter queue with the error's reason
//	                               (permanent, missing-id, invalid-id,
//	                               unparseable, …), then nil
//	*idemq.RequeueError          → republished to the smallest retry queue
//	                               whose delay is >= After, the attempt count
//	                               unchanged, then nil (see below); with
//	                               InPlace returned unchanged — the consumer
//	                               requeues it after After — while its
//	                               x-delivery-count is below half the
//	                               DeliveryLimit
//	any other error (transient)  → QuickAttempts in-process tries with a short
//	                               backoff; then republished to the retry
//	                               queue of this attempt (header
//	                               x-idemq-attempt = next attempt), then nil;
//	                               after MaxAttempts → dead-letter queue with
//	                               reason max-attempts
//	x-delivery-count >= DeliveryLimit (quorum queues; the broker counts
//	redeliveries after crashes and requeues)
//	                             → dead-letter queue with reason
//	                               delivery-limit, before the handler runs
//
// Order: every republish waits for the broker's confirm (idemq.Publisher)
// BEFORE the middleware returns nil and the consumer acks the original. A
// crash in between duplicates a retry or a dead letter (same message ID: the
// dedup guard sees one message); it never loses one. When the republish
// fails for a reason that passes (the connection is down, a confirm timed
// out) the middleware returns idemq.Requeue(PublishRetryAfter,
// "retry-publish-failed", err): the consumer does not ack, it puts the
// delivery back after the delay and the decision is taken again.
//
// A republish that can never succeed is a permanent failure, never a loop:
//
//	retry, no valid message ID    → dead-letter queue, reason missing-id /
//	                                invalid-id (a retry must keep its ID)
//	retry queue missing (returned → dead-letter queue, reason handler-error
//	unroutable), headers invalid
//	or too large
//	dead letter too large         → sent again with only the message's own
//	                                headers, x-idemq-reason and -attempts
//	dead letter unroutable (DLQ   → idemq.Reject: the consumer nacks without
//	deleted), invalid, still too    requeue, the broker's dead-letter
//	large                           exchange (if any) takes it; an error log
//	                                line and the counter retry_unpublishable
//	no dead-letter queue          → idemq.Reject likewise (counter
//	(topology dlq: "-")             retry_no_dlq): no DLQ means no DLQ
//
// A deferral (RequeueError) is never dead-lettered for a failed republish:
// it waits in place and the layer that deferred it decides again.
// [NewPolicy] ([Config.Validate]) refuses, at startup, delays without their
// retry queue and a dead-letter queue the topology does not declare.
//
// Inbound x-idemq-* headers are trusted only on a delivery that came back
// through idemq's own path ([FromRetryPath]: default exchange, its own queue
// as routing key, and the x-idemq-queue marker with x-idemq-attempt or
// x-idemq-requeues). On any other delivery the policy drops them before it
// reads them, so the original exchange and routing key it records are the
// delivery's own, a forged attempt count uses up nothing, and a forged
// route cannot steer a replay. Every x-idemq-* header it writes is bounded
// (the error text by ErrorTextLimit, at most [MaxErrorTextLimit]; the
// others at 255 bytes), so what it adds stays a few KiB below frame_max.
//
// Decisions rest on two counters only: x-idemq-attempt, which the policy
// rewrites on every hop (a missing or garbage value counts as attempt 1, so
// it can reset the count at most once), and the broker's own
// x-delivery-count. The broker's x-death header is parsed defensively
// ([ParseXDeath]) for diagnostics and for the CLI (why and from where the
// broker dead-lettered a message); its counts are never used to decide.
//
// Retry queues are per-delay queues "<queue>.retry.<ms>" with x-message-ttl
// and a dead-letter route back to the work queue; the dead-letter queue is
// "<queue>.dlq". The names and arguments come from the topology package
// ([topology.ForQueue]); use [ForTopology] to configure the policy from the
// same declaration that creates the queues.
//
// A RequeueError (the dedup guard's store is unavailable) is republished to
// a retry queue rather than held and nacked, so the consumer's prefetch is
// not filled with parked deliveries and a long outage does not run up the
// quorum delivery count; it carries x-idemq-requeues (how many times) but
// does not count as an attempt. With InPlace (the guard: another consumer
// holds the lease), no Publisher or no retry queue it is returned unchanged
// and the consumer requeues it after After, without holding a worker. A
// requeue counts as a delivery on quorum queues (RabbitMQ 3.x), so an
// in-place deferral whose x-delivery-count has reached half the
// DeliveryLimit is republished (confirmed, then acked) to the work queue
// itself, which starts the count again, rather than pushed towards the
// limit — not to a retry queue, whose dead-lettering a broker restart can
// drop.
//
// Retry queues dead-letter back to the work queue at most once (RabbitMQ's
// default for TTL expiry): a message that expires in a retry queue while
// the broker restarts can be dropped by the broker (the bank demo with
// --broker-restarts lost 10 of 500 transfers in one restart when in-flight
// deferrals were parked there). That is why in-flight deferrals stay in
// place. Quorum queues' at-least-once dead-lettering would close the gap;
// on RabbitMQ 3.10.8 its supervisor died under queue deletion right after a
// restart and then no such queue could start, so idemq does not declare it.
//
// Without a Publisher the policy degrades: transient errors are still tried
// QuickAttempts times, then every error is returned to the consumer, which
// nacks without requeue — the work queue's dead-letter arguments (topology)
// route it to the dead-letter queue, where the broker's x-death header says
// why.
//
// The message ID, body, content type and headers are kept on every
// republish; the per-message expiration is dropped (it would fire inside a
// retry queue) and the broker's x-delivery-count header is removed. A
// delivery whose ID is missing or invalid cannot be published under its own
// ID: its dead letter gets a fresh ID and the original, if any, in
// x-idemq-original-message-id.
package retry
