package idemq

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/failover"
	"github.com/idemq/idemq/internal/mgmt"
)

// ErrStartup is matched (errors.Is) by the error [Consumer.Run] returns when
// the consumer never got to consume: a permanent error at startup (see
// [StartupError]) or ConsumerConfig.StartupAttempts failed attempts.
var ErrStartup = errors.New("idemq: consumer could not start")

// ErrInvalidURL is matched (errors.Is) by the error of a broker URL that
// does not parse. The URL is named redacted, never with its password.
var ErrInvalidURL = failover.ErrInvalidURL

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

// permanentAMQP are the AMQP reply codes that retrying the same connect,
// declare and consume cannot change.
var permanentAMQP = map[int]bool{
	amqp.AccessRefused:      true, // 403: wrong credentials, no permission on the vhost, queue or exchange
	amqp.NotFound:           true, // 404: the queue (or an exchange Setup binds) does not exist
	amqp.PreconditionFailed: true, // 406: a declaration that conflicts with the existing one
	amqp.NotAllowed:         true, // 530: the vhost does not exist or may not be used
}

// DefaultLoginGrace is ConsumerConfig.LoginGrace's default.
const DefaultLoginGrace = 10 * time.Second

// isLoginRefused reports whether err (or, over several brokers, any of
// them) is a login the broker refused at connection open. amqp091-go
// returns [amqp.ErrCredentials] or [amqp.ErrVhost] when the broker closes
// the socket during the handshake, which a booting node does too.
func isLoginRefused(err error) bool {
	return errors.Is(err, amqp.ErrCredentials) || errors.Is(err, amqp.ErrVhost)
}

// isPermanentStartup reports whether err, from a session that never
// subscribed, cannot be fixed by retrying. A failed pass over several
// brokers is permanent only when every broker's error is.
func isPermanentStartup(err error) bool {
	if err == nil {
		return false
	}
	var all *failover.AllFailed
	if errors.As(err, &all) {
		for _, e := range all.Errs {
			if !isPermanentStartup(e) {
				return false
			}
		}
		return len(all.Errs) > 0
	}
	if errors.Is(err, ErrInvalidURL) || mgmt.Permanent(err) {
		return true
	}
	var ae *amqp.Error
	return errors.As(err, &ae) && permanentAMQP[ae.Code]
}
