package idemq

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
)

// Counter names recorded by the consumer and the layers of defence. The
// outcome counters (acked, processed, duplicates, retried, dead_lettered,
// rejected, requeued, dependency_unavailable) are counted by the consumer
// from the [Decision] it carried out, once per delivery, whatever layers
// the pipeline has; the layers count only their own events (leases lost,
// store errors, in-flight deferrals, …). A delivery's outcome is counted
// before it is counted acked: once acked reaches n, the outcomes of those
// n deliveries are in their counters.
const (
	CountDelivered      = "delivered"         // deliveries received from the broker
	CountRedelivered    = "redelivered"       // of which flagged redelivered by the broker
	CountAcked          = "acked"             // acked (processed, duplicate, or republished: retried, dead-lettered)
	CountProcessed      = "processed"         // the handler itself ran and succeeded
	CountFailed         = "failed"            // runs of the handler chain that returned an error (not a duplicate)
	CountRejected       = "rejected"          // nacked without requeue (no failure policy, or one that cannot republish)
	CountRequeued       = "requeued"          // nacked with requeue after a delay
	CountPanics         = "panics"            // handler panics recovered
	CountDuplicates     = "duplicates"        // suppressed duplicates (dedup or inbox)
	CountInFlight       = "inflight_deferred" // deferred: another consumer holds the lease
	CountLeasesLost     = "leases_lost"       // a dedup lease lost while the handler ran or at complete
	CountStoreErrors    = "store_errors"      // dedup store unavailable or failing
	CountReconnects     = "reconnects"        // connection or channel re-established
	CountPublished      = "published"         // publisher: confirmed publishes
	CountPublishRetries = "publish_retries"   // publisher: attempts resent
	// CountPublishReturned: publisher: publishes returned unroutable.
	CountPublishReturned = "publish_returned"
	// GaugePublishInFlight: publisher: publishes waiting for their
	// confirm, recorded as deltas (+1, -1).
	GaugePublishInFlight = "publish_inflight"
	CountDeadLettered    = "dead_lettered" // sent to the dead-letter queue
	CountRetried         = "retried"       // sent to a delay queue for a later attempt
	// CountReleased: deliveries taken from a delay queue when due,
	// republished to the work queue (confirmed) and acked there.
	CountReleased = "retry_released"
	// CountReleasedLate: of those, released more than a second after
	// they were due (the consumer was down, or the broker restarted).
	CountReleasedLate = "retry_released_late"
	// CountReleaseFailed: republishes of due deliveries that failed (the
	// work queue missing, the broker unreachable); the delivery stays in
	// its delay queue and is tried again.
	CountReleaseFailed = "retry_release_failed"
	CountFailOpen      = "fail_open"       // processed without the dedup store (fail-open)
	CountUncertain     = "dedup_uncertain" // the store could not tell done from new (dedup.ErrUncertain)

	// Dependency outages (see BreakerConfig).
	CountUnavailable       = "dependency_unavailable" // deliveries given back: a dependency was unavailable (not an attempt)
	CountDependencyOutages = "dependency_outages"     // times the breaker paused the consumer
	CountPausedMillis      = "paused_ms"              // total time paused by the breaker, in milliseconds
	// CountProbedOutages: failed runs whose error named no outage, made
	// outages because a breaker probe failed when asked (not attempts).
	CountProbedOutages = "dependency_probed_outages"
)

// Counter names for handler time limits.
const (
	// CountHandlerTimeouts: handlers whose context reached its deadline
	// (HandlerTimeout or the ConsumerTimeout bound) and that failed.
	CountHandlerTimeouts = "handler_timeouts"
	// CountStuckHandlers: deliveries still being handled after
	// StuckHandlerAfter (counted once each).
	CountStuckHandlers = "stuck_handlers"
	// CountExpiredDeliveries: deliveries given back without running
	// because they waited in the client until too close to the
	// ConsumerTimeout bound.
	CountExpiredDeliveries = "expired_deliveries"
)

// Recorder receives counter increments. It must be safe for concurrent use.
// [Counters] keeps them in memory; adapt it to your metrics system (one
// Prometheus counter per name, say) by implementing Add.
type Recorder interface {
	Add(name string, delta int64)
}

// Counters is an in-memory [Recorder]. The zero value is ready to use.
type Counters struct {
	m sync.Map // name → *atomic.Int64
}

// Add implements [Recorder].
func (c *Counters) Add(name string, delta int64) {
	v, ok := c.m.Load(name)
	if !ok {
		v, _ = c.m.LoadOrStore(name, new(atomic.Int64))
	}
	v.(*atomic.Int64).Add(delta)
}

// Get returns the current value of a counter.
func (c *Counters) Get(name string) int64 {
	v, ok := c.m.Load(name)
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

// Snapshot returns every counter.
func (c *Counters) Snapshot() map[string]int64 {
	out := map[string]int64{}
	c.m.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return out
}

// Names returns the counter names seen so far, sorted.
func (c *Counters) Names() []string {
	var names []string
	c.m.Range(func(k, _ any) bool { names = append(names, k.(string)); return true })
	sort.Strings(names)
	return names
}

type recorderKey struct{}

// WithRecorder returns a context carrying r; the consumer puts its recorder
// in every handler context so middlewares count into the same place.
func WithRecorder(ctx context.Context, r Recorder) context.Context {
	return context.WithValue(ctx, recorderKey{}, r)
}

// RecorderFrom returns the recorder in ctx, or a no-op one.
func RecorderFrom(ctx context.Context) Recorder {
	if r, ok := ctx.Value(recorderKey{}).(Recorder); ok && r != nil {
		return r
	}
	return nopRecorder{}
}

type nopRecorder struct{}

func (nopRecorder) Add(string, int64) {}
