package gate

import (
	"math/bits"
	"sync"
	"time"

	"github.com/idemq/idemq"
)

// Stats is a snapshot of a gate's counters, for logs and tests (a metrics
// adapter reads the same numbers through [Config.Recorder]).
type Stats struct {
	Received     int64 // deliveries taken from the ingress queue
	Forwarded    int64 // messages forwarded to every route and confirmed
	Duplicates   int64 // copies of an ID already forwarded within the window: acked, dropped
	Deferred     int64 // copies that arrived while another gate held the ID: given back for later
	DeadLettered int64 // sent to the dead-letter queue (no ID, unroutable, refused)
	Unroutable   int64 // of which returned unroutable by a target
	Refused      int64 // of which refused by the broker
	StoreErrors  int64 // dedup store calls that failed
	LeasesLost   int64 // leases lost while forwarding (the copy was given back)
	Retries      int64 // forward attempts retried (lost connection, nack, missing exchange)
	Reconnects   int64
	// ForwardLatency: from the delivery's receipt by the gate to the
	// confirm of its last route (claim included).
	ForwardLatency LatencyStats
}

// LatencyStats summarises forward latencies. Quantiles come from
// power-of-two microsecond buckets: each is an upper bound within 2×.
type LatencyStats struct {
	Count    int64
	Mean     time.Duration
	P50, P99 time.Duration
	Max      time.Duration
}

// Stats returns the gate's counters now.
func (g *Gate) Stats() Stats {
	c := g.counters
	return Stats{
		Received:       c.Get(idemq.CountDelivered),
		Forwarded:      c.Get(CountForwarded),
		Duplicates:     c.Get(idemq.CountDuplicates),
		Deferred:       c.Get(idemq.CountInFlight),
		DeadLettered:   c.Get(idemq.CountDeadLettered),
		Unroutable:     c.Get(CountUnroutable),
		Refused:        c.Get(CountRefused),
		StoreErrors:    c.Get(idemq.CountStoreErrors),
		LeasesLost:     c.Get(idemq.CountLeasesLost),
		Retries:        c.Get(CountForwardRetries),
		Reconnects:     c.Get(idemq.CountReconnects),
		ForwardLatency: g.lat.stats(),
	}
}

// Counters returns every counter the gate and its consumer recorded.
func (g *Gate) Counters() map[string]int64 { return g.counters.Snapshot() }

const latBuckets = 40

// latency is a small histogram of durations in power-of-two microsecond
// buckets.
type latency struct {
	mu      sync.Mutex
	n       int64
	sum     time.Duration
	max     time.Duration
	buckets [latBuckets]int64
}

func (l *latency) observe(d time.Duration) {
	us := uint64(d / time.Microsecond)
	b := bits.Len64(us) // 0 for <1µs, k for [2^(k-1), 2^k) µs
	if b >= latBuckets {
		b = latBuckets - 1
	}
	l.mu.Lock()
	l.n++
	l.sum += d
	l.max = max(l.max, d)
	l.buckets[b]++
	l.mu.Unlock()
}

func (l *latency) stats() LatencyStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := LatencyStats{Count: l.n, Max: l.max}
	if l.n == 0 {
		return s
	}
	s.Mean = l.sum / time.Duration(l.n)
	q := func(p float64) time.Duration {
		want := int64(p*float64(l.n)) + 1
		var seen int64
		for b, c := range l.buckets {
			seen += c
			if seen >= want {
				return min(time.Duration(uint64(1)<<b)*time.Microsecond, l.max)
			}
		}
		return l.max
	}
	s.P50, s.P99 = q(0.50), q(0.99)
	return s
}
