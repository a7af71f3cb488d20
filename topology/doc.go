// Package topology declares what idemq needs on the broker — exchanges, work
// queues, their dead-letter queue and their retry (delay) queues, bindings —
// from Go structs or a YAML file, idempotently.
//
// It is the one source of truth for the names and arguments of the failure
// flow: [ForQueue] computes them, [Declare] declares them and the retry
// package publishes to them. For a work queue "orders":
//
//	orders                 the work queue (classic or quorum);
//	                       x-dead-letter-exchange "" and
//	                       x-dead-letter-routing-key "orders.dlq", so anything
//	                       the broker itself rejects or drops (a nack without
//	                       requeue, the quorum x-delivery-limit) still lands
//	                       in the dead-letter queue; quorum queues get
//	                       x-delivery-limit as a backstop against loops.
//	orders.dlq             the dead-letter queue: by default a quorum queue
//	                       (a member on each node: a node loss leaves it
//	                       available to Setup and to dead letters) with
//	                       x-delivery-limit [DLQDeliveryLimit] (reading it
//	                       non-destructively counts a delivery, and
//	                       RabbitMQ 4 would otherwise drop a dead letter
//	                       read 20 times). dlq_type: classic declares the
//	                       former classic DLQ, which lives on one node:
//	                       while that node is down, declaring it fails on
//	                       every node (so does a consumer's Setup) and the
//	                       broker cannot route dead letters to it (the
//	                       retry policy holds them back until it can).
//	orders.retry.<ms>      one durable delay queue per retry delay:
//	                       x-message-ttl <ms>, x-dead-letter-exchange "" and
//	                       x-dead-letter-routing-key "orders". A message
//	                       published there sits for <ms> and is then
//	                       dead-lettered by the broker back to the work queue
//	                       — delayed retries without any plugin. Every
//	                       message in one delay queue has the same TTL, so
//	                       expiry at the head of the queue is exact. By
//	                       default a quorum queue with
//	                       x-dead-letter-strategy at-least-once and
//	                       x-overflow reject-publish: the broker keeps an
//	                       expired message until the work queue confirmed
//	                       it, so it survives a restart (RabbitMQ 3.10+;
//	                       TestFaultRetryQueuesSurviveBrokerRestarts).
//	                       retry_type: classic declares the former classic
//	                       delay queues, whose dead-lettering is at most
//	                       once: a message expiring while the broker
//	                       restarts can be dropped.
//
// Switching an existing deployment from classic to quorum retry queues:
// the broker refuses to redeclare a queue with another type (a
// [*MismatchError] on x-queue-type). Either set retry_type: classic, or
// stop the consumers, wait for the retry queues to drain into the work
// queue, delete them and declare again. The same holds for a classic DLQ
// declared by an older idemq: the mismatch says to set dlq_type: classic,
// or to move its dead letters out (idemq dlq replay --routing-key OTHER,
// or a shovel),
// delete it and declare again.
//
// [Topology.Validate] (run by [Load] and [Declare]) refuses what would
// declare something other than what the plan says: x-queue-type in args
// contradicting type, the dead-letter and delivery-limit arguments the plan
// computes itself, a dlq that is the queue itself or another work queue,
// integer arguments (x-message-ttl, x-max-length, …) given as strings such
// as "1h", delivery_limit on a classic queue, names over 255 bytes. Load
// also refuses a second YAML document. dlq: "-" means no dead-letter queue:
// [Plan.Notes] says so (a delivery that fails for good is rejected and the
// broker drops it).
//
// A PRECONDITION_FAILED (406) from the broker because a queue already exists
// with other arguments becomes a [*MismatchError] naming the queue and the
// arguments that were asked for. The broker closes the channel on a 406;
// [Declare] stops at the first error and the caller must open a new channel.
package topology
