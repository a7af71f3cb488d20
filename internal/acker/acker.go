// Package acker settles the deliveries of one AMQP channel: it coalesces
// their acknowledgements ([Acker]) and gives deferred ones back after a
// delay ([Requeuer]). The consumer's executor is its only user.
//
// Deliveries on a channel carry increasing delivery tags. Workers finish them
// in any order; the Acker sends basic.ack with multiple=true up to the highest
// tag whose every predecessor has been settled, so one frame acknowledges a
// whole run. It never acknowledges a tag that is still in a worker's hands and
// never settles a tag twice (RabbitMQ closes the channel with
// PRECONDITION_FAILED on an unknown tag).
//
// Negative acknowledgements are sent at once, one tag at a time. A tag that
// waits behind a slow predecessor for longer than StuckAfter is acknowledged on
// its own, so one long handler does not pin the whole prefetch window.
//
// Memory is bounded by the channel's prefetch window: the Acker holds only
// the tags that are not yet on the wire (in a worker's hands, or acked and
// waiting to be coalesced). A tag settled on its own (a nack, an individual
// ack past a stuck predecessor) is forgotten at once; a tag below the
// highest registered one that the Acker does not hold is settled. However
// many deliveries go past one stuck handler, the Acker holds at most the
// window.
//
// An Acker belongs to one channel: when the channel dies, the Acker is closed
// and every later decision for its tags is dropped (the broker redelivers
// those messages on the next channel).
package acker

import (
	"errors"
	"sync"
	"time"
)

// Channel is the part of *amqp091.Channel the Acker needs.
type Channel interface {
	Ack(tag uint64, multiple bool) error
	Nack(tag uint64, multiple, requeue bool) error
}

// Config tunes coalescing. The zero value is usable.
type Config struct {
	// MaxBatch is the number of settled tags after which an ack is sent
	// without waiting for the flush interval. Default 50.
	MaxBatch int
	// FlushInterval bounds how long a settled ack may wait to be sent.
	// Default 20ms.
	FlushInterval time.Duration
	// StuckAfter is how long an acknowledged tag may wait behind an
	// unsettled predecessor before it is acknowledged on its own.
	// Default 250ms.
	StuckAfter time.Duration
	// OnError is called (outside the lock) when an ack or nack frame could
	// not be sent. Optional.
	OnError func(error)
}

// ErrClosed is returned for decisions made after Close.
var ErrClosed = errors.New("acker: closed (the channel is gone; the broker will redeliver)")

// ErrUnknownTag is returned for a tag that was never registered or is
// already settled: settling it would break the channel.
var ErrUnknownTag = errors.New("acker: unknown or already settled delivery tag")

type state uint8

const (
	outstanding state = iota // in a worker's hands
	ackPending               // decided ack, not yet on the wire
)

type entry struct {
	state     state
	decidedAt time.Time
}

// Acker coalesces acks for one channel. It is safe for concurrent use.
type Acker struct {
	ch  Channel
	cfg Config

	mu   sync.Mutex
	next uint64 // lowest tag not yet known to be settled or in the sent prefix
	max  uint64 // highest registered tag
	// entries holds the tags not yet on the wire: outstanding or
	// ackPending. A registered tag (<= max) missing from it is settled.
	entries map[uint64]*entry
	waiting int    // ackPending entries behind an outstanding predecessor
	lastAck uint64 // highest tag in the settled prefix that is ackPending
	batch   int    // ackPending tags in the prefix not yet sent
	closed  bool

	stop chan struct{}
	done chan struct{}
}

// New returns an Acker for ch and starts its flush timer.
func New(ch Channel, cfg Config) *Acker {
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 50
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = 20 * time.Millisecond
	}
	if cfg.StuckAfter <= 0 {
		cfg.StuckAfter = 250 * time.Millisecond
	}
	a := &Acker{
		ch:      ch,
		cfg:     cfg,
		next:    1,
		entries: make(map[uint64]*entry),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	go a.loop()
	return a
}

// Register records a tag received from the broker. Tags must be registered
// in increasing order, before any decision about them.
func (a *Acker) Register(tag uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	if tag <= a.max {
		return ErrUnknownTag
	}
	// Tags may skip (they never do on one channel, but be safe): a skipped
	// tag is not ours to settle; not holding it means settled.
	a.max = tag
	a.entries[tag] = &entry{state: outstanding}
	return nil
}

// Ack records that tag was processed. The frame is coalesced.
func (a *Acker) Ack(tag uint64) error {
	var errs []error
	a.mu.Lock()
	e, err := a.take(tag)
	if err != nil {
		a.mu.Unlock()
		return err
	}
	e.state = ackPending
	e.decidedAt = time.Now()
	a.waiting++
	errs = a.advance(false, errs)
	a.mu.Unlock()
	a.report(errs)
	return nil
}

// Nack sends a negative acknowledgement for tag at once.
func (a *Acker) Nack(tag uint64, requeue bool) error {
	a.mu.Lock()
	if _, err := a.take(tag); err != nil {
		a.mu.Unlock()
		return err
	}
	delete(a.entries, tag) // settled: forgotten at once
	var errs []error
	if err := a.ch.Nack(tag, false, requeue); err != nil {
		errs = append(errs, err)
	}
	errs = a.advance(false, errs)
	a.mu.Unlock()
	a.report(errs)
	return nil
}

// Len returns how many tags the Acker holds in memory: the registered tags
// not yet on the wire. It is bounded by the channel's prefetch window.
func (a *Acker) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.entries)
}

// Close flushes the settled prefix, sends individual acks for any acked tag
// behind an unsettled one, and stops the Acker. Later decisions return
// ErrClosed. Close is idempotent.
func (a *Acker) Close() {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	errs := a.advance(true, nil)
	errs = a.unstick(time.Time{}, errs)
	a.closed = true
	a.mu.Unlock()
	close(a.stop)
	<-a.done
	a.report(errs)
}

// Abandon stops the Acker without sending anything (the channel is dead).
func (a *Acker) Abandon() {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.closed = true
	a.mu.Unlock()
	close(a.stop)
	<-a.done
}

func (a *Acker) take(tag uint64) (*entry, error) {
	if a.closed {
		return nil, ErrClosed
	}
	e, ok := a.entries[tag]
	if !ok || e.state != outstanding {
		return nil, ErrUnknownTag
	}
	return e, nil
}

// advance moves the settled prefix forward and sends a multiple-ack when the
// batch is full or when force is set (the flush timer, Close). Called with
// a.mu held.
func (a *Acker) advance(force bool, errs []error) []error {
	for a.next <= a.max {
		if len(a.entries) == 0 {
			// Everything registered is settled or in the prefix.
			a.next = a.max + 1
			break
		}
		e, ok := a.entries[a.next]
		if ok {
			if e.state == outstanding {
				break
			}
			// ackPending: joins the prefix the next multiple-ack covers.
			a.lastAck = a.next
			a.batch++
			a.waiting--
			delete(a.entries, a.next)
		}
		// Not held: settled on its own already (a nack, an individual
		// ack); a multiple-ack past it does not touch it again.
		a.next++
	}
	if a.batch == 0 {
		return errs
	}
	if force || a.batch >= a.cfg.MaxBatch {
		if err := a.ch.Ack(a.lastAck, true); err != nil {
			errs = append(errs, err)
		}
		a.batch = 0
	}
	return errs
}

// unstick acknowledges, one by one, acked tags that wait behind an
// outstanding predecessor and were decided before cutoff (all of them when
// cutoff is zero). Called with a.mu held.
func (a *Acker) unstick(cutoff time.Time, errs []error) []error {
	if a.waiting == 0 {
		return errs // the common case: nothing waits behind a slow handler
	}
	for tag, e := range a.entries {
		if e.state != ackPending {
			continue
		}
		if !cutoff.IsZero() && e.decidedAt.After(cutoff) {
			continue
		}
		if err := a.ch.Ack(tag, false); err != nil {
			errs = append(errs, err)
		}
		// On the wire: forgotten at once, so a stuck predecessor does not
		// make the map grow with every delivery that goes past it.
		delete(a.entries, tag)
		a.waiting--
	}
	return errs
}

func (a *Acker) loop() {
	defer close(a.done)
	t := time.NewTicker(a.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case now := <-t.C:
			if !a.tick(now) {
				return
			}
		}
	}
}

// tick is one run of the flush timer: it sends the settled prefix and
// acknowledges on their own the acked tags that waited behind an unsettled
// predecessor for longer than StuckAfter. It reports false once closed.
func (a *Acker) tick(now time.Time) bool {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return false
	}
	errs := a.advance(true, nil)
	errs = a.unstick(now.Add(-a.cfg.StuckAfter), errs)
	a.mu.Unlock()
	a.report(errs)
	return true
}

func (a *Acker) report(errs []error) {
	if a.cfg.OnError == nil {
		return
	}
	for _, err := range errs {
		a.cfg.OnError(err)
	}
}
