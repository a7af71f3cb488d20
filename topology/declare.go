package topology

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
)

// ErrMismatch is wrapped by every [*MismatchError].
var ErrMismatch = errors.New("topology: declared arguments differ from the existing ones")

// MismatchError is a PRECONDITION_FAILED (406) from the broker: Name already
// exists with other properties or arguments. Argument is the one the broker
// named as inequivalent (empty when its message named none); Asked is what
// this declare asked for; Detail is the broker's text, which carries the
// current value.
type MismatchError struct {
	Kind     string // "queue" or "exchange"
	Name     string
	Argument string
	Asked    any        // the value asked for Argument (nil: not asked, i.e. "none")
	Declared amqp.Table // every argument this declare asked for
	Detail   string
	// Hint says what to do when there is more to say than "delete the
	// old one or change the declaration" (an existing classic DLQ).
	Hint string
}

func (e *MismatchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "topology: %s %q exists with different arguments", e.Kind, e.Name)
	if e.Argument != "" {
		fmt.Fprintf(&b, ": argument %s differs (asked for %s)", e.Argument, showValue(e.Asked))
	}
	fmt.Fprintf(&b, "; declared %s; broker said: %s", showTable(e.Declared), e.Detail)
	if e.Hint != "" {
		b.WriteString(" — " + e.Hint)
	} else {
		b.WriteString(" — delete the old one or change the declaration")
	}
	return b.String()
}

func (e *MismatchError) Unwrap() error { return ErrMismatch }

var inequivalent = regexp.MustCompile(`inequivalent arg '([^']+)' for (queue|exchange) '([^']*)'`)

func mismatch(err error, kind, name string, declared amqp.Table) error {
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		return fmt.Errorf("topology: declare %s %q: %w", kind, name, err)
	}
	me := &MismatchError{Kind: kind, Name: name, Declared: declared, Detail: ae.Reason}
	if m := inequivalent.FindStringSubmatch(ae.Reason); m != nil {
		me.Argument = m[1]
		switch m[1] {
		case "durable":
			me.Asked = true
		case "auto_delete", "exclusive", "internal":
			me.Asked = false
		default:
			me.Asked = declared[m[1]]
		}
	}
	return me
}

func showValue(v any) string {
	if v == nil {
		return "none"
	}
	if s, ok := v.(string); ok {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%v", v)
}

func showTable(t amqp.Table) string {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + showValue(t[k])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// Declare declares t on ch: exchanges, then for each queue its dead-letter
// queue, its retry queues and the work queue (see [ForQueue]), then the
// bindings. Every object is durable; declaring again is a no-op. It stops at
// the first error; a [*MismatchError] (406) closes ch, so open a new channel
// before using the connection again.
func Declare(ctx context.Context, ch *amqp.Channel, t Topology) error {
	if err := t.Validate(); err != nil {
		return fmt.Errorf("topology: invalid: %w", err)
	}
	for _, e := range t.Exchanges {
		if err := ctx.Err(); err != nil {
			return err
		}
		typ := e.Type
		if typ == "" {
			typ = amqp.ExchangeDirect
		}
		args := table(e.Args)
		if err := ch.ExchangeDeclare(e.Name, typ, true, e.AutoDelete, e.Internal, false, args); err != nil {
			if args == nil {
				args = amqp.Table{}
			}
			args["type"] = typ
			return mismatch(err, "exchange", e.Name, args)
		}
	}
	for _, q := range t.Queues {
		if err := DeclareQueue(ctx, ch, q); err != nil {
			return err
		}
	}
	for _, b := range t.Bindings {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := ch.QueueBind(b.Queue, b.RoutingKey, b.Exchange, false, table(b.Args)); err != nil {
			return fmt.Errorf("topology: bind %s -> %s (%q): %w", b.Exchange, b.Queue, b.RoutingKey, err)
		}
	}
	return nil
}

// DeclareQueue declares one work queue with its dead-letter and retry queues.
func DeclareQueue(ctx context.Context, ch *amqp.Channel, q Queue) error {
	if q.Name == "" {
		return errors.New("topology: queue name is required")
	}
	p := ForQueue(q)
	declare := func(name string, args amqp.Table) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
			return mismatch(err, "queue", name, args)
		}
		return nil
	}
	if p.DLQ != "" {
		if err := declare(p.DLQ, p.DLQArgs); err != nil {
			var me *MismatchError
			if errors.As(err, &me) && p.DLQType == Quorum && q.DLQType == "" &&
				(me.Argument == ArgQueueType || me.Argument == ArgDeliveryLimit) {
				me.Hint = fmt.Sprintf("dead-letter queues are quorum queues by default now; "+
					"set dlq_type: classic on queue %q to keep this one, or move its messages out, delete it and let Setup declare it again (docs/OPERATIONS.md, \"Dead-letter queue type\")", q.Name)
			}
			return err
		}
	}
	for _, r := range p.Retries {
		if err := declare(r.Name, r.Args); err != nil {
			return err
		}
	}
	return declare(p.Queue, p.Args)
}

// SetupFunc returns a [idemq.SetupFunc] that declares t; use it as
// ConsumerConfig.Setup or PublisherConfig.Setup.
func SetupFunc(t Topology) idemq.SetupFunc {
	return func(ctx context.Context, ch *amqp.Channel) error { return Declare(ctx, ch, t) }
}
