package idemq

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/internal/deadline"
	"github.com/idemq/idemq/internal/failover"
)

// Sentinel errors callers can match with errors.Is.
var (
	// ErrMissingMessageID: a publish or a delivery without a message ID.
	ErrMissingMessageID = errors.New("idemq: missing message ID")
	// ErrInvalidMessageID: an ID that is too long or has control characters.
	ErrInvalidMessageID = errors.New("idemq: invalid message ID")
	// ErrUnroutable: the broker returned a mandatory message (no queue bound).
	ErrUnroutable = errors.New("idemq: message returned as unroutable")
	// ErrNacked: the broker refused a publish (basic.nack) and retries ran out.
	ErrNacked = errors.New("idemq: publish nacked by the broker")
	// ErrInvalidHeaders: a publish whose headers AMQP cannot encode (a
	// value of an unsupported type); it is not sent and not retried.
	ErrInvalidHeaders = errors.New("idemq: invalid message headers")
	// ErrClosed: the publisher or consumer was closed.
	ErrClosed = errors.New("idemq: closed")
	// ErrMessageTooLarge: a publish whose encoded properties and headers do
	// not fit the connection's frame_max (the broker would close the
	// connection). It is not sent and not retried.
	ErrMessageTooLarge = errors.New("idemq: message headers too large for the frame size")
	// ErrLeaseLost: the dedup lease of the delivery being handled was lost
	// (not renewed in time, or taken by another consumer). A handler's
	// context is cancelled with it as the cause.
	ErrLeaseLost = errors.New("idemq: dedup lease lost")
	// ErrDependencyUnavailable: a dependency the consumer needs (the
	// database, the dedup store) cannot be reached. Match it with errors.Is
	// on an [*UnavailableError].
	ErrDependencyUnavailable = errors.New("idemq: dependency unavailable")
	// ErrInvalidConfig is matched (errors.Is) by every configuration idemq
	// refuses: the root's configs and each package's, whose own
	// ErrInvalidConfig (retry.ErrInvalidConfig, dedup.ErrInvalidConfig, …)
	// is a [ConfigErrorClass].
	ErrInvalidConfig = errors.New("idemq: invalid config")
)

// ConfigErrorClass returns a package's invalid-config sentinel: an error
// whose text is msg and that errors.Is matches with [ErrInvalidConfig].
func ConfigErrorClass(msg string) error { return configClass(msg) }

type configClass string

func (e configClass) Error() string        { return string(e) }
func (e configClass) Is(target error) bool { return target == ErrInvalidConfig }

// UnavailableError says a dependency (Dependency names it: "postgres",
// "redis", "dedup-store") could not be reached. It is not the message's
// fault: the failure policy does not count it as an attempt, and the
// consumer pauses taking deliveries while it lasts. It wraps
// [ErrDependencyUnavailable] and the cause.
type UnavailableError struct {
	Dependency string
	Err        error
}

func (e *UnavailableError) Error() string {
	return "dependency " + e.Dependency + " unavailable: " + errString(e.Err)
}

// Unwrap returns both the sentinel and the cause.
func (e *UnavailableError) Unwrap() []error { return []error{ErrDependencyUnavailable, e.Err} }

// Unavailable returns an [*UnavailableError] for dependency with cause err.
// Unavailable(dep, nil) returns nil.
func Unavailable(dependency string, err error) error {
	if err == nil {
		return nil
	}
	return &UnavailableError{Dependency: dependency, Err: err}
}

// IsUnavailable reports whether err says a dependency is unavailable.
func IsUnavailable(err error) bool { return errors.Is(err, ErrDependencyUnavailable) }

// Dead-letter reasons carried in the x-idemq-reason header.
const (
	ReasonHandlerError  = "handler-error"
	ReasonPermanent     = "permanent"
	ReasonMissingID     = "missing-id"
	ReasonInvalidID     = "invalid-id"
	ReasonMaxAttempts   = "max-attempts"
	ReasonDeliveryLimit = "delivery-limit"
	ReasonUnparseable   = "unparseable"
	ReasonPanic         = "panic"
	// ReasonSuspectedDuplicate: the dedup store could not tell whether the
	// message was processed (dedup.ErrUncertain): replay it once verified.
	ReasonSuspectedDuplicate = "suspected-duplicate"
)

// PermanentError marks a failure that no retry can fix: the delivery goes
// straight to the dead-letter queue. Create one with [Permanent].
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent: " + errString(e.Err) }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err so the failure policy dead-letters the delivery
// without retrying it. Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err (or anything it wraps) is permanent:
// a [PermanentError] or a [RejectError].
func IsPermanent(err error) bool {
	var p *PermanentError
	var r *RejectError
	return errors.As(err, &p) || errors.As(err, &r)
}

// RejectError says a delivery cannot be processed at all (no ID, an
// unparseable body): it is dead-lettered with Reason, never retried and
// never processed unguarded. Create one with [Reject].
type RejectError struct {
	Reason string // one of the Reason* constants, or your own
	Err    error
}

func (e *RejectError) Error() string { return e.Reason + ": " + errString(e.Err) }
func (e *RejectError) Unwrap() error { return e.Err }

// Reject returns a [RejectError] with reason and the cause err.
func Reject(reason string, err error) error {
	return &RejectError{Reason: reason, Err: err}
}

// RequeueError says the delivery was not processed and must come back later
// — not counted as a failed attempt, never acked as done. The dedup guard
// returns it when another consumer holds the message's lease, or when its
// store is unavailable. Create one with [Requeue].
type RequeueError struct {
	After  time.Duration // the earliest it should come back
	Reason string
	Err    error
	// InPlace asks a failure policy to leave the delivery in its queue —
	// the consumer nacks it with requeue after After — rather than park it
	// in a delay queue. RabbitMQ dead-letters out of a TTL queue at most
	// once: a parked message that expires while the broker restarts can be
	// dropped. The dedup guard sets it for in-flight deferrals (short, one
	// or two per crashed consumer), not for store outages (which would
	// loop every delivery through the broker's delivery count).
	InPlace bool
}

func (e *RequeueError) Error() string {
	return fmt.Sprintf("requeue after %v (%s): %s", e.After, e.Reason, errString(e.Err))
}
func (e *RequeueError) Unwrap() error { return e.Err }

// Requeue returns a [RequeueError].
func Requeue(after time.Duration, reason string, err error) error {
	return &RequeueError{After: after, Reason: reason, Err: err}
}

// RequeueInPlace returns a [RequeueError] with InPlace set: the delivery
// stays in its queue until it comes back.
func RequeueInPlace(after time.Duration, reason string, err error) error {
	return &RequeueError{After: after, Reason: reason, Err: err, InPlace: true}
}

// PanicError is what a panicking handler becomes: a failed handler, not a
// dead process.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("handler panicked: %v", e.Value) }

// ReasonOf returns the dead-letter reason for a handler error.
func ReasonOf(err error) string {
	var r *RejectError
	if errors.As(err, &r) {
		return r.Reason
	}
	var p *PermanentError
	if errors.As(err, &p) {
		return ReasonPermanent
	}
	var pe *PanicError
	if errors.As(err, &pe) {
		return ReasonPanic
	}
	return ReasonHandlerError
}

// ErrStartup is matched (errors.Is) by the error [Consumer.Run] returns when
// the consumer never got to consume: a permanent error at startup (see
// [StartupError]) or ConsumerConfig.StartupAttempts failed attempts.
var ErrStartup = errors.New("idemq: consumer could not start")

// StartupError is what [Consumer.Run] returns when it gives up before its
// first subscription: Permanent is true for an error retrying cannot fix
// (access refused — a wrong user or password once ConsumerConfig.LoginGrace
// has passed, a vhost or queue the user may not use —, the queue not found, a topology declaration that conflicts
// with the broker's, a URL that does not parse); otherwise Attempts
// reached ConsumerConfig.StartupAttempts. errors.Is(err, [ErrStartup])
// holds; errors.As reaches the cause (an *amqp.Error with its Code).
type StartupError struct {
	Attempts  int
	Permanent bool
	Err       error
}

func (e *StartupError) Error() string {
	if e.Permanent {
		return fmt.Sprintf("idemq: consumer could not start (permanent error, not retried): %v", e.Err)
	}
	return fmt.Sprintf("idemq: consumer could not start after %d attempts: %v", e.Attempts, e.Err)
}

func (e *StartupError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrStartup) hold.
func (e *StartupError) Is(target error) bool { return target == ErrStartup }

// ErrInvalidURL is matched (errors.Is) by the error of a broker URL that
// does not parse. The URL is named redacted, never with its password.
var ErrInvalidURL = failover.ErrInvalidURL

// ErrHandlerTimeout is the cause of a handler context cancelled at its
// deadline (see ConsumerConfig.HandlerTimeout and ConsumerTimeout). A
// handler can test context.Cause(ctx) for it; a failed handler's error
// reaches the failure policy as a [*HandlerTimeoutError].
var ErrHandlerTimeout = deadline.ErrHandlerTimeout

// HandlerTimeoutError is what a handler's error becomes when the handler
// failed after its context reached its deadline. It is an ordinary failed
// attempt for the failure policy (retried with delay, then dead-lettered),
// not a shutdown: the delivery is not acked, the dedup guard releases its
// claim and the inbox rolls back, so the redelivery applies it once.
type HandlerTimeoutError struct {
	// Limit is how long the handler was given.
	Limit time.Duration
	// ConsumerTimeout says the limit came from the broker's consumer
	// timeout bound rather than from HandlerTimeout.
	ConsumerTimeout bool
	// Err is what the handler returned.
	Err error
}

func (e *HandlerTimeoutError) Error() string {
	return fmt.Sprintf("%s after %v (%s): %s", ErrHandlerTimeout.Error(), e.Limit, e.source(), errString(e.Err))
}

func (e *HandlerTimeoutError) source() string {
	if e.ConsumerTimeout {
		return "bounded below the broker's consumer_timeout"
	}
	return "HandlerTimeout"
}

// Unwrap returns [ErrHandlerTimeout] and the handler's error.
func (e *HandlerTimeoutError) Unwrap() []error { return []error{ErrHandlerTimeout, e.Err} }

// ReturnedError is the error for a mandatory message the broker returned
// (no queue bound to its routing key). It wraps [ErrUnroutable].
type ReturnedError struct {
	MessageID  string
	Exchange   string
	RoutingKey string
	ReplyCode  uint16
	ReplyText  string
}

func (e *ReturnedError) Error() string {
	return fmt.Sprintf("idemq: message %q returned by the broker: %d %s (exchange %q, routing key %q)",
		e.MessageID, e.ReplyCode, e.ReplyText, e.Exchange, e.RoutingKey)
}
func (e *ReturnedError) Unwrap() error { return ErrUnroutable }

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
