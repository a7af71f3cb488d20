package bench

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// BodySize is the payload of every benchmark message.
const BodySize = 256

func amqpURL() string {
	if u := os.Getenv("IDEMQ_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

func dial(tb testing.TB) *amqp.Connection {
	tb.Helper()
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		msg := fmt.Sprintf("RabbitMQ not reachable (%v): run `make services`", err)
		if os.Getenv("CI") == "true" {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	return conn
}

// freshQueue declares a durable classic queue, deleted at cleanup.
func freshQueue(tb testing.TB, name string) string {
	tb.Helper()
	conn := dial(tb)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := ch.QueueDelete(name, false, false, false); err != nil {
		tb.Fatal(err)
	}
	ch, _ = conn.Channel()
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		c, err := amqp.Dial(amqpURL())
		if err != nil {
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			_, _ = ch.QueueDelete(name, false, false, false)
		}
	})
	return name
}

// Prefetch is the QoS every consumer case uses unless it says otherwise.
const Prefetch = 200

// DupGap is how far back a duplicate's ID is taken from in the
// duplicates variant: farther than the prefetch window, so the original is
// normally done (not in flight) when its duplicate arrives, as with a
// producer's resend or a redelivery after a lost ack.
const DupGap = 2*Prefetch + 1

// fill publishes n persistent messages of BodySize bytes with IDs
// "<prefix>-<k>", with async confirms and a window of 2000. When dupEvery >
// 0, every dupEvery-th message repeats the ID of the message DupGap
// positions earlier (the previous one while fewer precede it) instead of
// taking a new one: dupEvery 5 makes 20% duplicates. It returns how many
// messages repeat an earlier ID.
func fill(tb testing.TB, queue string, n int, prefix string, dupEvery int) int {
	tb.Helper()
	conn := dial(tb)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		tb.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		tb.Fatal(err)
	}
	body := make([]byte, BodySize)
	_, _ = rand.Read(body)
	// 10 minutes, more for the scale run: 1M messages at the 2.4k/s a
	// loaded shared machine gave take 7 minutes.
	ctx, cancel := context.WithTimeout(context.Background(), max(10*time.Minute, time.Duration(n)*time.Millisecond))
	defer cancel()
	window := make(chan *amqp.DeferredConfirmation, 2000)
	errc := make(chan error, 1)
	go func() {
		for dc := range window {
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				errc <- fmt.Errorf("confirm: ok=%v err=%v", ok, err)
				for range window {
				}
				return
			}
		}
		errc <- nil
	}()
	ids := make([]int, n)
	next, dups := 0, 0
	for i := 0; i < n; i++ {
		switch {
		case dupEvery > 0 && i%dupEvery == dupEvery-1 && i >= DupGap:
			ids[i] = ids[i-DupGap]
			dups++
		case dupEvery > 0 && i%dupEvery == dupEvery-1 && i > 0:
			ids[i] = ids[i-1]
			dups++
		default:
			next++
			ids[i] = next
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, MessageId: fmt.Sprintf("%s-%d", prefix, ids[i]), Body: body,
		})
		if err != nil {
			tb.Fatal(err)
		}
		window <- dc
	}
	close(window)
	if err := <-errc; err != nil {
		tb.Fatal(err)
	}
	return dups
}
