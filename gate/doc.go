// Package gate is a deduplicating forwarder: broker-layer deduplication by
// message ID for consumers written in any language. It consumes an ingress
// queue and forwards each message, unchanged, to one or more target
// exchanges, each message ID at most once within a window; consumers read
// the targets' queues, where every ID appears once, and need no idemq code.
//
// It is the "build your own" broker layer in front of consumers, in place
// of the community rabbitmq-message-deduplication plugin, which keeps its
// cache in the broker (Mnesia: lost with the node, removed in RabbitMQ
// 4.3, unsupported with Khepri), deduplicates at queue level only while
// the first copy is still in the queue, and does not support quorum
// queues there. The gate keeps its records in a dedup store (Redis by
// default; the SQL stores or the Bloom tier through [Config.Store]), works
// with any queue type on any RabbitMQ version, and scales out: several
// gates on one ingress queue share its messages and one set of records.
//
// Per delivery (idemq's consumer, dedup guard and failure policy do the
// bookkeeping):
//
//  1. the message ID is read ([Config.ID]: the AMQP message_id, a header
//     such as the plugin's x-deduplication-header, or a JSON field); none →
//     dead-lettered with reason missing-id (never dropped, never forwarded);
//  2. the ID is claimed in the store with a lease ("processing"): already
//     done within the window → acked and counted as a duplicate, never
//     forwarded; held by another gate → given back in place for after its
//     lease; store down → given back, the consumer pauses (fail-closed);
//  3. the message is published to every route — body, every property
//     (user_id, expiration, timestamp and delivery mode included) and every
//     header exactly as they arrived — mandatory, with publisher confirms,
//     on a channel with that one publish in flight (so a basic.return is
//     matched to it without adding a header); a returned (unroutable)
//     message is dead-lettered with reason unroutable, a publish the broker
//     refuses (406) with reason forward-refused; a lost connection or a
//     missing target exchange is retried for ForwardTimeout, then the
//     message is given back (not dead-lettered) and the consumer pauses
//     until the target answers;
//  4. after the last confirm the ID is completed ("done", kept for the
//     window);
//  5. then the delivery is acked.
//
// # The crash window, stated honestly
//
// A gate killed after a forward's publish has left for the broker and
// before the ID is completed (step 4) leaves the ID "processing" under its
// dead lease while the broker may have routed the copy: whether the
// confirm had arrived or not, the gate cannot tell any more. The broker
// redelivers the message and, once the lease has run out (Config.Lease,
// default 30 s), a gate forwards it again: downstream sees that message
// twice. So each kill can duplicate at most the messages that gate was
// forwarding at that instant (at most Workers); measured under load,
// 16 workers, SIGKILL at random points: 4.5–9.6 per kill (fault test
// TestFaultGateKill). Killed anywhere else nothing is duplicated, and a
// kill never loses a message: before the publish, the message is
// forwarded once after the lease; after Complete, the redelivery is acked
// as a duplicate. A lost connection is the same ambiguity for the publish
// on the wire (its confirm is lost, it is published again); when only
// the ingress connection drops, a publish already sent is seen through
// to its confirm and the ID completed, so the redelivery is acked as a
// duplicate. A consumer that must never see a message twice still needs
// its own dedup (idemq's guard or inbox); the gate removes the
// producers' and the broker's duplicates in front of it.
//
// Other limits: with several routes, a message unroutable at a later route
// has reached the earlier ones (its dead letter, replayed, reaches them
// again); an ingress copy that arrives after the window is forwarded again
// (as with any window); a dedup store restarted without persistence
// forgets its window. Table entries of the headers are re-encoded by
// amqp091-go in its own order (same keys, same typed values).
//
// Declare the ingress queue with its dead-letter queue and no retry queues
// ([IngressTopology]; in YAML: no_retry: true) and bind the producers'
// exchanges to it; `idemq gate` runs a gate from the command line.
package gate
