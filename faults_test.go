//go:build faults

package idemq_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
)

// restartBroker stops and starts the RabbitMQ application on the test node:
// every connection drops, durable queues and persistent messages survive.
// Fault tests run alone (make test runs them with -p 1 after the rest).
func restartBroker(t *testing.T) {
	t.Helper()
	if out, err := testenv.Rabbitmqctl("stop_app"); err != nil {
		t.Fatalf("rabbitmqctl stop_app: %v\n%s", err, out)
	}
	if out, err := testenv.Rabbitmqctl("start_app"); err != nil {
		t.Fatalf("rabbitmqctl start_app: %v\n%s", err, out)
	}
	testenv.Eventually(t, 60*time.Second, "broker back", func() bool {
		conn, err := amqp.Dial(testenv.AMQPURL())
		if err != nil {
			return false
		}
		conn.Close()
		return true
	})
}

// The consumer and the publisher carry on through a broker restart and
// nothing confirmed is lost.
func TestFaultBrokerRestart(t *testing.T) {
	testenv.RequireAMQP(t)
	queue := testenv.Name(t, "q")
	declare := func(ctx context.Context, ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(queue, true, false, false, false, nil)
		return err
	}
	t.Cleanup(func() { testenv.DeleteQueue(queue) })
	var rec idemq.Counters
	p, err := idemq.NewPublisher(idemq.PublisherConfig{Setup: declare, Logger: quietLogger(), Recorder: &rec, Retry: backoffFast()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const n = 2000
	if err := p.Publish(ctx, idemq.Message{ID: "warmup", RoutingKey: queue}); err != nil {
		t.Fatal(err)
	}
	tr := newTracker()
	c, stop := runConsumer(t, idemq.ConsumerConfig{Queue: queue, Setup: declare, Workers: 4, Prefetch: 50, Reconnect: backoffFast()},
		idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			time.Sleep(500 * time.Microsecond)
			tr.add(d.MessageID)
			return nil
		}))
	// The publisher keeps publishing until the restart is over and then
	// some more, so both sides are certain to meet the dead connection
	// (a publisher that had finished before the broker stopped would have
	// nothing to reconnect for).
	var published atomic.Int64
	restarted := make(chan struct{})
	pubDone := make(chan error, 1)
	go func() {
		after := int64(-1)
		for i := int64(0); ; i++ {
			if after < 0 {
				select {
				case <-restarted:
					after = i
				default:
				}
			}
			if after >= 0 && i >= after+200 {
				break
			}
			if i >= 500000 {
				pubDone <- fmt.Errorf("published %d messages and the restart has not finished", i)
				return
			}
			if err := p.Publish(ctx, idemq.Message{ID: fmt.Sprintf("r-%d", i), RoutingKey: queue}); err != nil {
				pubDone <- err
				return
			}
			published.Add(1)
		}
		pubDone <- nil
	}()
	testenv.Eventually(t, 60*time.Second, "progress", func() bool { return published.Load() > n/3 && tr.n.Load() > n/4 })
	restartBroker(t)
	close(restarted)
	if err := <-pubDone; err != nil {
		t.Fatalf("publisher: %v", err)
	}
	total := int(published.Load())
	testenv.Eventually(t, 90*time.Second, "every message handled", func() bool { return tr.distinct() == total+1 })
	if c.Counters().Get(idemq.CountReconnects) == 0 || rec.Get(idemq.CountReconnects) == 0 {
		t.Fatalf("expected both sides to reconnect (consumer %d, publisher %d)", c.Counters().Get(idemq.CountReconnects), rec.Get(idemq.CountReconnects))
	}
	if left := stopAndDrain(t, stop, queue); left != 0 {
		t.Fatalf("%d deliveries left unacked", left)
	}
}
