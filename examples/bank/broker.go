// The demo's own dealings with the broker, outside idemq: publishing the
// malformed messages raw, a queue's depth, draining the dead letters,
// deleting a mode's queues, and rabbitmqctl (connection cuts, restarts).

package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/topology"
)

// restartBroker stops and starts the RabbitMQ application on the local
// node: every connection drops, queues and persistent messages survive.
func restartBroker(ctx context.Context) error {
	for _, cmd := range []string{"stop_app", "start_app"} {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := rabbitmqctl(cctx, cmd)
		cancel()
		if err != nil {
			return fmt.Errorf("broker restart: %w", err)
		}
	}
	return nil
}

// rabbitmqctl runs rabbitmqctl args on the demo's node
// (IDEMQ_RABBITMQ_NODE); its output is in the error.
func rabbitmqctl(ctx context.Context, args ...string) error {
	full := append([]string{"-q", "-n", envOr("IDEMQ_RABBITMQ_NODE", "rabbit@localhost")}, args...)
	out, err := exec.CommandContext(ctx, "rabbitmqctl", full...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// rawPublish publishes msgs persistent, mandatory and confirmed,
// reconnecting until ctx ends (a broker restart may be in progress). A
// message whose confirm was lost with its connection is sent again: a
// malformed message may be dead-lettered twice, never not at all.
func rawPublish(ctx context.Context, amqpURL, queue string, msgs []amqp.Publishing) error {
	sent := 0
	for {
		n, err := rawPublishOnce(ctx, amqpURL, queue, msgs[sent:])
		sent += n
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("publish malformed messages: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// rawPublishOnce publishes msgs on one connection and returns how many
// were confirmed (and not returned) before the first failure.
func rawPublishOnce(ctx context.Context, amqpURL, queue string, msgs []amqp.Publishing) (int, error) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	if err := ch.Confirm(false); err != nil {
		return 0, err
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, len(msgs)))
	for i, m := range msgs {
		m.DeliveryMode = amqp.Persistent
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, m)
		if err != nil {
			return i, err
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return i, fmt.Errorf("malformed message not confirmed (nack or %v)", err)
		}
		select {
		case r := <-returns: // sent before the confirm: unroutable
			return i, fmt.Errorf("malformed message returned: %s", r.ReplyText)
		default:
		}
	}
	return len(msgs), nil
}

// queueDepth is the number of ready messages (a passive declare).
func queueDepth(amqpURL, queue string) (int, error) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return q.Messages, nil
}

// deadLetter is one dead letter of a mode's DLQ: its message ID, reason
// and error text (x-idemq-error).
type deadLetter struct{ id, reason, err string }

// drainReasons takes every dead letter of queue.
func drainReasons(amqpURL, queue string) ([]deadLetter, error) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	var out []deadLetter
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			return nil, err
		}
		if !ok {
			return out, nil
		}
		r, _ := d.Headers[idemq.HeaderReason].(string)
		if r == "" {
			r = "?"
		}
		e, _ := d.Headers[idemq.HeaderError].(string)
		out = append(out, deadLetter{id: d.MessageId, reason: r, err: e})
	}
}

// peekIDs returns the message IDs in queue without taking any (basic.get,
// then the channel closes and the broker requeues all).
func peekIDs(amqpURL, queue string) (map[string]bool, error) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	ids := map[string]bool{}
	for {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			return nil, err
		}
		if !ok {
			return ids, nil
		}
		ids[d.MessageId] = true
	}
}

// findInQueues looks for the IDs of want in the work and retry queues
// of p without taking anything (basic.get, then the channel closes and
// the broker requeues all): the queue each one found is in, by ID; and
// how many messages those queues hold that are neither ready nor
// unacked — kept by the broker's at-least-once dead-letter worker of a
// dead-letter route retry queue, out of reach of basic.get.
func findInQueues(amqpURL string, p topology.Plan, want map[string]bool) (map[string]string, int) {
	found := map[string]string{}
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return found, 0
	}
	defer conn.Close()
	names := []string{p.Queue}
	for _, r := range p.Retries {
		names = append(names, r.Name)
	}
	held := 0
	for _, n := range names {
		ch, err := conn.Channel()
		if err != nil {
			return found, held
		}
		qi, err := ch.QueueDeclarePassive(n, true, false, false, false, nil)
		if err != nil {
			continue // the channel is closed by the error
		}
		got := 0
		for {
			d, ok, err := ch.Get(n, false)
			if err != nil || !ok {
				break
			}
			got++
			if want[d.MessageId] {
				found[d.MessageId] = n
			}
		}
		if got < qi.Messages {
			held += qi.Messages - got
		}
		_ = ch.Close() // gives back everything it got
	}
	return found, held
}

// restartSettle is how long after a broker restart the demo waits before
// it deletes retry queues (see waitAfterRestart).
const restartSettle = 10 * time.Second

// waitAfterRestart sleeps until settle has passed since restartedAt
// (UnixNano; 0 means no restart, no wait).
func waitAfterRestart(restartedAt int64, settle time.Duration) {
	if restartedAt == 0 {
		return
	}
	if d := time.Until(time.Unix(0, restartedAt).Add(settle)); d > 0 {
		time.Sleep(d)
	}
}

func deleteQueues(amqpURL string, p topology.Plan) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return
	}
	defer conn.Close()
	names := []string{p.Queue, p.DLQ}
	for _, r := range p.Retries {
		names = append(names, r.Name)
	}
	for _, n := range names {
		if n == "" {
			continue
		}
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(n, false, false, false)
			_ = ch.Close()
		}
	}
}
