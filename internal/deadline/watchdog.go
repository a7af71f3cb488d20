package deadline

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Timeouts are a consumer's handler bounds, normalized.
type Timeouts struct {
	Handler time.Duration // HandlerTimeout; 0: none of its own
	Broker  time.Duration // the broker's consumer_timeout; 0: none
	Margin  time.Duration // handlers end this long before the broker acts
	Stuck   time.Duration // warn about a handler running this long; 0: never
}

// Bound is when handlers of a delivery received at receivedAt must be
// done by: the broker's consumer timeout minus the margin after it
// arrived. ok is false when there is no broker timeout.
func (t Timeouts) Bound(receivedAt time.Time) (at time.Time, ok bool) {
	if t.Broker <= 0 || receivedAt.IsZero() {
		return time.Time{}, false
	}
	return receivedAt.Add(t.Broker - t.Margin), true
}

// Item is what the watchdog logs of a delivery, and when it was received.
type Item struct {
	MessageID   string
	DeliveryTag uint64
	Redelivered bool
	ReceivedAt  time.Time
}

// Watchdog logs handlers that run long: once when a delivery has been in
// a worker's hands for Timeouts.Stuck, again at every doubling of that,
// and once when it nears its Bound. K identifies a delivery in flight.
type Watchdog[K comparable] struct {
	log     *slog.Logger
	onStuck func() // a delivery first seen stuck

	mu       sync.Mutex
	t        Timeouts
	inflight map[K]watched
}

type watched struct {
	Item
	start     time.Time
	nextWarn  time.Duration // age of the next stuck warning
	nearTold  bool
	stuckSeen bool
}

// NewWatchdog returns a watchdog for t; onStuck (optional) is called once
// per delivery seen stuck (a counter).
func NewWatchdog[K comparable](t Timeouts, log *slog.Logger, onStuck func()) *Watchdog[K] {
	if onStuck == nil {
		onStuck = func() {}
	}
	return &Watchdog[K]{log: log, onStuck: onStuck, t: t, inflight: map[K]watched{}}
}

func (w *Watchdog[K]) enabled() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.t.Stuck > 0 || w.t.Broker > 0
}

// SetTimeouts replaces the bounds (the broker's consumer timeout read
// for the queue). The check period set at Run stays. A nil watchdog
// ignores it.
func (w *Watchdog[K]) SetTimeouts(t Timeouts) {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.t = t
	w.mu.Unlock()
}

// period is how often the watchdog looks: a quarter of the shortest
// threshold, between 5ms and 1s.
func (w *Watchdog[K]) period() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := time.Second
	if w.t.Stuck > 0 {
		p = min(p, w.t.Stuck/4)
	}
	if w.t.Broker > 0 {
		p = min(p, w.t.Margin/4)
	}
	return max(p, 5*time.Millisecond)
}

// Track records k as being handled until the returned func is called.
func (w *Watchdog[K]) Track(k K, it Item) (done func()) {
	if !w.enabled() {
		return func() {}
	}
	w.mu.Lock()
	w.inflight[k] = watched{Item: it, start: time.Now(), nextWarn: w.t.Stuck}
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		delete(w.inflight, k)
		w.mu.Unlock()
	}
}

// Run checks the handlers in flight every period until ctx ends.
// It keeps running while it has nothing to watch: a consumer timeout read
// from the broker later (SetTimeouts) may give it something.
func (w *Watchdog[K]) Run(ctx context.Context) {
	tk := time.NewTicker(w.period())
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tk.C:
			if w.enabled() {
				w.check(now)
			}
		}
	}
}

type warning struct {
	it      Item
	age     time.Duration
	near    bool
	first   bool
	cancels time.Duration
}

func (w *Watchdog[K]) check(now time.Time) {
	var warns []warning
	w.mu.Lock()
	broker := w.t.Broker
	for k, s := range w.inflight {
		age := now.Sub(s.start)
		changed := false
		if w.t.Stuck > 0 && age >= s.nextWarn {
			warns = append(warns, warning{it: s.Item, age: age, first: !s.stuckSeen})
			s.stuckSeen = true
			for s.nextWarn <= age {
				s.nextWarn *= 2
			}
			changed = true
		}
		if b, ok := w.t.Bound(s.ReceivedAt); ok && !s.nearTold {
			// Near: within a fifth of the bound (at least one margin).
			if left := b.Sub(now); left <= max((w.t.Broker-w.t.Margin)/5, w.t.Margin) {
				warns = append(warns, warning{it: s.Item, age: age, near: true, cancels: left})
				s.nearTold = true
				changed = true
			}
		}
		if changed {
			w.inflight[k] = s
		}
	}
	w.mu.Unlock()
	for _, wn := range warns {
		if wn.near {
			w.log.Warn("idemq: handler nears the broker's consumer_timeout; its context is cancelled before the broker would close the channel",
				"message_id", wn.it.MessageID, "delivery_tag", wn.it.DeliveryTag, "age", wn.age.Round(time.Millisecond),
				"cancelled_in", max(wn.cancels, 0).Round(time.Millisecond), "consumer_timeout", broker)
			continue
		}
		if wn.first {
			w.onStuck()
		}
		w.log.Warn("idemq: handler still running (stuck?)",
			"message_id", wn.it.MessageID, "delivery_tag", wn.it.DeliveryTag, "age", wn.age.Round(time.Millisecond),
			"redelivered", wn.it.Redelivered)
	}
}
