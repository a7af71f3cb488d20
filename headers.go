package idemq

// Wire header names. Every header idemq reads or writes is named here, once;
// the retry policy, the dead-letter tools, the Bloom router and the
// publisher use these constants.
//
// Inbound x-idemq-* headers are trusted only on a delivery that came back
// through idemq's own retry path (see retry.FromRetryPath): a producer can
// set any header.
const (
	// HeaderPrefix starts every header idemq writes.
	HeaderPrefix = "x-idemq-"

	// HeaderAttempt, on a retry: the attempt this delivery is (1-based).
	HeaderAttempt = "x-idemq-attempt"
	// HeaderAttempts, on a dead letter: the attempts made.
	HeaderAttempts = "x-idemq-attempts"
	// HeaderRequeues: times sent back without an attempt (a deferral).
	HeaderRequeues = "x-idemq-requeues"
	// HeaderReason, on a dead letter or a suspected duplicate: why (one of
	// the Reason* constants).
	HeaderReason = "x-idemq-reason"
	// HeaderError: the last error's text (bounded).
	HeaderError = "x-idemq-error"
	// HeaderErrorClass: [ReasonOf] the last error (handler-error, panic, …).
	HeaderErrorClass = "x-idemq-error-class"
	// HeaderFirstFailure and HeaderLastFailure: failure times (RFC 3339).
	HeaderFirstFailure = "x-idemq-first-failure"
	HeaderLastFailure  = "x-idemq-last-failure"
	// HeaderOriginalExchange and HeaderOriginalRoutingKey: where the
	// message was first published.
	HeaderOriginalExchange   = "x-idemq-original-exchange"
	HeaderOriginalRoutingKey = "x-idemq-original-routing-key"
	// HeaderOriginalMessageID: a dead letter's original ID when it was not
	// valid (the dead letter got a fresh one).
	HeaderOriginalMessageID = "x-idemq-original-message-id"
	// HeaderOriginalQueue, on a suspected duplicate: the work queue.
	HeaderOriginalQueue = "x-idemq-original-queue"
	// HeaderGroup: the consumer group that failed the message.
	HeaderGroup = "x-idemq-group"
	// HeaderQueue: the work queue that failed (or deferred) the message;
	// with HeaderAttempt or HeaderRequeues, the marker of idemq's own
	// retry path.
	HeaderQueue = "x-idemq-queue"
	// HeaderDue, on a delivery parked in a delay queue: when it is due
	// back in its work queue, in Unix milliseconds. The consumer that
	// releases the delay queue holds the delivery until then (at most the
	// queue's delay after it took it) and removes the header when it
	// hands the delivery back (see [DelayedRetries]).
	HeaderDue = "x-idemq-due"
	// HeaderDeadLetterHeld, on a delivery the retry policy holds back
	// because its dead letter could not be routed (the dead-letter queue is
	// missing, or unavailable while its node is down): the dead-letter
	// reason. Such a delivery comes back through the retry path and is
	// dead-lettered again before any handler runs.
	HeaderDeadLetterHeld = "x-idemq-dead-letter-held"
	// HeaderDeadLetteredAt: when the policy dead-lettered the message.
	HeaderDeadLetteredAt = "x-idemq-dead-lettered-at"
	// HeaderReplayedAt: when a dead letter was replayed.
	HeaderReplayedAt = "x-idemq-replayed-at"
	// HeaderDedupKey, on a suspected duplicate: its dedup key.
	HeaderDedupKey = "x-idemq-dedup-key"
	// HeaderPublishSeq is the header the [Publisher] sets on a publish
	// attempt while another publish of the same message ID is in flight on
	// its channel: the attempt's publish sequence number there. The broker
	// copies it into a basic.return, which is how a return is matched to
	// exactly the publish it belongs to; without it the message ID does
	// (most publishes carry no header of idemq's: a header table costs the
	// broker about a fifth of its publish rate). It means nothing outside
	// that channel: consumers ignore it, and a republished delivery that
	// still carries it has it removed.
	HeaderPublishSeq = "x-idemq-pubseq"

	// HeaderDeliveryCount is set by quorum queues: how many times the
	// broker delivered the message.
	HeaderDeliveryCount = "x-delivery-count"
	// HeaderDeath is set by the broker when it dead-letters a message.
	HeaderDeath = "x-death"
)
