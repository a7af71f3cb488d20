package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/redact"
)

// ErrRefused is wrapped by the error of a publish the broker refused for
// good by closing the channel with PRECONDITION_FAILED (406): a user_id
// property that is not the gate's user (give the gate's user the
// impersonator tag, or run it as the producers' user), a message over the
// broker's max_message_size. The message is dead-lettered with reason
// [ReasonRefused].
var ErrRefused = errors.New("gate: publish refused by the broker")

// errTransient marks a forward attempt that failed for a reason that passes
// (a lost connection, a nack, a missing target exchange): retried.
var errTransient = errors.New("gate: forward attempt failed")

// forwarder publishes deliveries unchanged, with confirms and mandatory,
// one publish in flight per channel: a basic.return on a channel then
// belongs to its one publish, without a header of ours to match it by (the
// message goes out exactly as it came in). Channels are pooled; a worker
// takes one per publish.
type forwarder struct {
	url       string
	dial      func(string, amqp.Config) (*amqp.Connection, error)
	log       *slog.Logger
	heartbeat time.Duration

	mu     sync.Mutex
	conn   *amqp.Connection
	closed bool
	idle   []*fwdChan
}

type fwdChan struct {
	conn     *amqp.Connection
	ch       *amqp.Channel
	confirms chan amqp.Confirmation
	returns  chan amqp.Return
	closes   chan *amqp.Error
}

func newForwarder(url string, dial func(string, amqp.Config) (*amqp.Connection, error), log *slog.Logger) *forwarder {
	return &forwarder{url: url, dial: dial, log: log, heartbeat: 10 * time.Second}
}

// take returns an idle channel of the live connection or opens one.
func (f *forwarder) take() (*fwdChan, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, idemq.ErrClosed
	}
	for len(f.idle) > 0 {
		fc := f.idle[len(f.idle)-1]
		f.idle = f.idle[:len(f.idle)-1]
		if fc.conn == f.conn && !fc.conn.IsClosed() && !fc.ch.IsClosed() {
			return fc, nil
		}
		_ = fc.ch.Close()
	}
	if f.conn == nil || f.conn.IsClosed() {
		conn, err := dialRedacted(f.dial, f.url, amqp.Config{
			Heartbeat:  f.heartbeat,
			Locale:     "en_US",
			Properties: amqp.Table{"connection_name": "idemq gate forwarder"},
		})
		if err != nil {
			return nil, fmt.Errorf("%w: dial: %w", errTransient, err)
		}
		f.conn = conn
	}
	ch, err := f.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("%w: open channel: %w", errTransient, err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("%w: enable confirms: %w", errTransient, err)
	}
	// One publish in flight: the buffers never fill, so the client's
	// reader never blocks on them even for a channel being abandoned.
	fc := &fwdChan{conn: f.conn, ch: ch,
		confirms: ch.NotifyPublish(make(chan amqp.Confirmation, 2)),
		returns:  ch.NotifyReturn(make(chan amqp.Return, 2)),
		closes:   ch.NotifyClose(make(chan *amqp.Error, 1)),
	}
	return fc, nil
}

// give puts a healthy channel back.
func (f *forwarder) give(fc *fwdChan) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || fc.conn != f.conn || fc.ch.IsClosed() {
		_ = fc.ch.Close()
		return
	}
	f.idle = append(f.idle, fc)
}

func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	f.idle = nil
	if f.conn != nil {
		_ = f.conn.Close()
	}
}

// publishOnce sends pub to exchange/key (mandatory) on a channel of its
// own and waits for the confirm. It returns nil (confirmed and routed), a
// *idemq.ReturnedError (confirmed but unroutable), an error wrapping
// ErrRefused (the broker closed the channel with 406), an error wrapping
// errTransient, or ctx's error.
//
// ctx bounds the attempt (ForwardTimeout). hctx is the handler's context:
// no publish is sent once it has ended, but a publish already on the wire
// is waited for up to grace more when hctx ends for a reason other than a
// lost lease (the consumer's channel died): once it is confirmed the ID
// can be completed and the broker's redelivery is acked as a duplicate,
// instead of being forwarded a second time. grace is short enough that
// the lease (renewed every Lease/3, trusted for 0.8×Lease) still holds.
func (f *forwarder) publishOnce(ctx, hctx context.Context, grace time.Duration, exchange, key string, pub amqp.Publishing) error {
	if err := hctx.Err(); err != nil {
		return err
	}
	fc, err := f.take()
	if err != nil {
		return err
	}
	healthy := false
	defer func() {
		if healthy {
			f.give(fc)
		} else {
			_ = fc.ch.Close()
		}
	}()
	if err := fc.ch.PublishWithContext(ctx, exchange, key, true, false, pub); err != nil {
		return fmt.Errorf("%w: publish: %w", errTransient, err)
	}
	var ret *idemq.ReturnedError
	returned := func(r amqp.Return) {
		ret = &idemq.ReturnedError{MessageID: r.MessageId, Exchange: r.Exchange, RoutingKey: r.RoutingKey,
			ReplyCode: r.ReplyCode, ReplyText: r.ReplyText}
	}
	hdone := hctx.Done()
	var graceC <-chan time.Time
	for {
		select {
		case <-hdone:
			if errors.Is(context.Cause(hctx), idemq.ErrLeaseLost) {
				return context.Cause(hctx)
			}
			hdone = nil
			t := time.NewTimer(grace)
			defer t.Stop()
			graceC = t.C
		case <-graceC:
			return hctx.Err()
		case r, ok := <-fc.returns:
			if ok {
				returned(r)
			} else {
				fc.returns = nil
			}
		case c, ok := <-fc.confirms:
			if !ok {
				return f.closedErr(fc)
			}
			// The broker sends a message's return before its confirm and
			// the client hands them over in that order: a return is in its
			// buffer by now if there is one.
			select {
			case r, ok := <-fc.returns:
				if ok {
					returned(r)
				}
			default:
			}
			healthy = true
			switch {
			case !c.Ack:
				return fmt.Errorf("%w: %w", errTransient, idemq.ErrNacked)
			case ret != nil:
				return ret
			}
			return nil
		case <-fc.closes:
			return f.closedErr(fc)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// closedErr classifies why a channel closed under a publish.
func (f *forwarder) closedErr(fc *fwdChan) error {
	var e *amqp.Error
	select {
	case e = <-fc.closes:
	case <-time.After(time.Second):
	}
	if e == nil {
		return fmt.Errorf("%w: channel closed before the confirm", errTransient)
	}
	if e.Server && e.Code == amqp.PreconditionFailed {
		return fmt.Errorf("%w: %w", ErrRefused, e)
	}
	// 404 (the target exchange does not exist), 403 (no write permission),
	// a connection closed: an outage of the target, not the message's fault.
	return fmt.Errorf("%w: channel closed before the confirm: %w", errTransient, e)
}

// dial connects like the idemq consumer does: the URL's password never
// reaches an error (amqp091-go quotes a URL it cannot parse).
func dialRedacted(dial func(string, amqp.Config) (*amqp.Connection, error), rawURL string, cfg amqp.Config) (*amqp.Connection, error) {
	if _, err := amqp.ParseURI(rawURL); err != nil {
		return nil, fmt.Errorf("invalid AMQP URL %s", redact.URL(rawURL))
	}
	conn, err := dial(rawURL, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %s", redact.URL(rawURL), redact.Scrub(redact.Text(err.Error()), redact.Secrets(rawURL)))
	}
	return conn, nil
}
