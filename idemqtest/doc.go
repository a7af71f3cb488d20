// Package idemqtest is a test kit that proves a handler idempotent — or
// shows where it is not — in a plain `go test`, without a broker.
//
// # Check
//
// [Check] (and [CheckIdempotent], which fails the test) runs your
// idemq.Pipeline — failure policy, middleware, dedup guard, handler or an
// inbox's handler — over a list of messages, several times:
//
//	duplicates     each message delivered Options.Copies times, shuffled,
//	               on Options.Workers goroutines at once
//	before-claim   the same, and each message's first delivery crashes
//	               before any layer ran
//	in-handler     … crashes inside the handler, effect written, not committed
//	after-commit   … crashes after Pipeline.Handler returned nil (committed),
//	               before the guard completed its record and before the ack
//	before-ack     … crashes after the decision, before it is carried out
//
// A crashed delivery is abandoned and redelivered with Redelivered set, as
// the broker does when a consumer's channel dies. After each scenario the
// kit reads how many times each message's effect was applied (your
// Target.Applied: a balance divided by the amount, rows in a table) and
// reports the messages applied more than once, lost (never applied, not
// dead-lettered or rejected) or stuck (redelivered for ever), with the
// crash point, the attempt that crashed and every delivery's decision.
// Each scenario gets a fresh Target from your [Setup], so verdicts do not
// leak between scenarios. The shuffle is seeded (Options.Seed, printed in
// the report) to replay a failure.
//
// # How a delivery runs: the consumer's own code
//
// Each delivery runs through [idemq.Pipeline.Decide]: the consumer's own
// decision loop (policy admits, chain runs, quick retries, policy decides),
// not a copy of it. The kit then carries the decision out the way the
// consumer's executor does on a broker: an ack settles it; a requeue gives
// it back (Redelivered set); a publish of a retry or a deferral delivers
// the published message again (its delay is not waited: time is virtual);
// a dead letter or a reject settles it as not to be applied. A deferral
// (another consumer holds the lease) waits until another delivery settles;
// when only deferred deliveries are left, the kit advances Target.Clock by
// their delay — the lease of a delivery nobody will finish expires — and
// hands them back. What belongs to the consumer and not to the pipeline is
// not exercised: the handler deadline, the breaker, the AMQP session.
//
// # Crashes
//
// The kit reaches three points by itself: before-claim (it does not run
// the pipeline), after-commit (it wraps Pipeline.Handler: nil returned
// means committed) and before-ack (it does not carry the decision out). It
// cannot see inside a handler, so the in-handler point is a hook:
// [CrashPoint](ctx, InHandler), which a handler calls right before it
// commits, or [BeforeCommit] around an inbox handler. CrashPoint does
// nothing outside the kit (it reads a context value), so it may stay in
// production code. A scenario whose point was never reached says so
// (Scenario.Reached).
//
// A crash is runtime.Goexit on the delivery's goroutine: no code after the
// crash point runs (no commit, no Complete, no ack), and the deferred calls
// pending on that goroutine do — an open transaction rolls back, the dedup
// guard gives up its claim. That is what a process's death amounts to once
// its database connection drops and its lease expires; the guard
// releasing at once rather than its lease expiring later changes when the
// redelivery may run, not what it does. (A handler that commits in a
// deferred call is the one shape this misreads: its commit would run.)
// A crash ends one delivery, not the others in flight: each is a consumer
// of its own dying.
//
// # Fixtures
//
// [Clock] and [NewStore] (idemq's dedup.Memory on that clock: advance it
// past a lease to expire it, past the window to forget a record,
// [LoseRecord] to lose one); [OpenSQLite] for an inbox on SQLite
// (modernc, no cgo, no server), so the exactly-once path runs in a unit
// test; [NewDelivery] with [WithHeader], [WithXDeath], [WithRedelivered],
// [WithDeliveryCount], [WithID]; [Decide] and the assertions on its
// decision: [RequireAcked], [RequireDuplicate], [RequireDeadLettered],
// [RequireRetried], [RequireRequeued].
//
// Not in the kit (yet): an in-memory broker the Consumer itself runs on.
package idemqtest
