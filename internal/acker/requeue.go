package acker

import (
	"sync"
	"time"
)

// Requeuer gives deliveries back to the broker (nack with requeue) after a
// delay, without holding a worker: a deferred delivery (another consumer
// holds its lease, a dependency is down) waits here, not in a goroutine.
// On shutdown [Requeuer.Flush] gives the waiting ones back at once. It
// belongs to one Acker, hence one channel.
type Requeuer struct {
	ack *Acker
	// requeued is called after each nack with requeue that the Acker
	// accepted (a counter).
	requeued func()

	mu     sync.Mutex
	timers map[uint64]*time.Timer
}

// NewRequeuer returns a Requeuer over a; requeued (optional) is called for
// every delivery it gives back.
func NewRequeuer(a *Acker, requeued func()) *Requeuer {
	if requeued == nil {
		requeued = func() {}
	}
	return &Requeuer{ack: a, requeued: requeued, timers: map[uint64]*time.Timer{}}
}

// Later nacks tag with requeue after the delay (at once when after <= 0).
func (r *Requeuer) Later(tag uint64, after time.Duration) {
	if after <= 0 {
		r.now(tag)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.timers[tag] = time.AfterFunc(after, func() {
		r.mu.Lock()
		_, mine := r.timers[tag]
		delete(r.timers, tag)
		r.mu.Unlock()
		if mine {
			r.now(tag)
		}
	})
}

func (r *Requeuer) now(tag uint64) {
	if r.ack.Nack(tag, true) == nil {
		r.requeued()
	}
}

// Pending returns how many deliveries wait to be given back.
func (r *Requeuer) Pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.timers)
}

// Flush gives every waiting delivery back at once (shutdown).
func (r *Requeuer) Flush() {
	r.mu.Lock()
	tags := make([]uint64, 0, len(r.timers))
	for tag, t := range r.timers {
		t.Stop()
		tags = append(tags, tag)
	}
	r.timers = map[uint64]*time.Timer{}
	r.mu.Unlock()
	for _, tag := range tags {
		r.now(tag)
	}
}
