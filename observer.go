package idemq

import (
	"errors"
	"time"
)

// Observer is a [Recorder] that also hears about every settled delivery,
// with its decision and timings: what a metrics system needs for outcome
// counters by label and duration histograms (package metrics implements
// it). When ConsumerConfig.Recorder is an Observer, the consumer's
// executor calls Settled once per delivery, after the ack or nack was
// handed to the channel; it must be cheap and safe for concurrent use.
type Observer interface {
	Recorder
	Settled(d *Delivery, s Settlement)
}

// Settlement is what the executor did with one delivery.
type Settlement struct {
	// Decision is the decision carried out (after any failed publish was
	// decided again); Decision.Action is ActionPublish only when the
	// publish was confirmed.
	Decision Decision
	// Handler is the time spent running the handler chain (every run of
	// it, quick retries included).
	Handler time.Duration
	// Total is the time from the delivery's receipt by the consumer to its
	// settlement (Handler plus the wait for a worker, the policy's
	// publishes and pauses).
	Total time.Duration
}

// Duplicate layers: which layer of defence recognised a duplicate
// ([DuplicateError.Layer], [DuplicateLayer]).
const (
	LayerGuard = "guard" // the dedup guard's store said done
	LayerInbox = "inbox" // the inbox row was already there
	LayerBloom = "bloom" // the dedup guard over a Bloom-tiered store said done
)

// DuplicateError is an [ErrDuplicate] that says which layer recognised the
// duplicate. errors.Is(err, ErrDuplicate) holds for it.
type DuplicateError struct {
	Layer string
}

func (e *DuplicateError) Error() string { return ErrDuplicate.Error() + " (" + e.Layer + ")" }

// Is makes a *DuplicateError match [ErrDuplicate].
func (e *DuplicateError) Is(target error) bool { return target == ErrDuplicate }

var dupByLayer = map[string]*DuplicateError{
	LayerGuard: {Layer: LayerGuard},
	LayerInbox: {Layer: LayerInbox},
	LayerBloom: {Layer: LayerBloom},
}

// Duplicate returns the [ErrDuplicate] of a layer (no allocation for the
// known layers).
func Duplicate(layer string) error {
	if e, ok := dupByLayer[layer]; ok {
		return e
	}
	return &DuplicateError{Layer: layer}
}

// DuplicateLayer returns the layer that recognised the duplicate err, ""
// when err is not a duplicate, "unknown" for a plain [ErrDuplicate].
func DuplicateLayer(err error) string {
	if !IsDuplicate(err) {
		return ""
	}
	var de *DuplicateError
	if errors.As(err, &de) {
		return de.Layer
	}
	return "unknown"
}
