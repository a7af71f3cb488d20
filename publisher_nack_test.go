package idemq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
)

// TestPublishNackNotTurnedIntoAck: a publish the broker nacks must fail,
// even when the nack overtakes earlier publishes' acks on the channel and
// a later ack covers it with multiple=true. RabbitMQ does that: a queue
// that refuses a publish (reject-publish overflow, or a quorum queue whose
// leader's node is down) nacks it at once, while earlier publishes to a
// quorum queue wait for their Raft commit, and then their acks come
// coalesced as one basic.ack multiple=true whose tag is past the nacked
// one. amqp091-go's NotifyPublish resequences confirms and, on a multiple
// ack, reports every tag up to it as acked, the stored nack included: a
// publisher reading it returned success for a message no queue took
// (TestClusterRetryNodeLoss lost retries this way while a retry queue's
// leader was being re-elected, docs/RABBITMQ_VERSIONS.md).
//
// Here the refusing queue is a classic queue with x-max-length 0 and
// reject-publish, and the healthy one a quorum queue, both on one
// channel: every publish to the first must fail with ErrNacked.
func TestPublishNackNotTurnedIntoAck(t *testing.T) {
	testenv.RequireRealBroker(t, "needs the broker's confirm coalescing and quorum queues")
	ok := testenv.Name(t, "qq")
	full := testenv.Queue(t, amqp.Table{"x-max-length": int64(0), "x-overflow": "reject-publish"})
	ch := testenv.Channel(t)
	if _, err := ch.QueueDeclare(ok, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.DeleteQueue(ok) })

	p, err := idemq.NewPublisher(idemq.PublisherConfig{Logger: quietLogger(), Dial: testenv.Dial, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 2000
	var wg sync.WaitGroup
	var mu sync.Mutex
	var falseAcks, nacked []string
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			q, id := ok, fmt.Sprintf("ok-%d", i)
			if i%2 == 1 {
				q, id = full, fmt.Sprintf("full-%d", i)
			}
			err := p.Publish(ctx, idemq.Message{ID: id, RoutingKey: q, Body: []byte(id)})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case q == full && err == nil:
				falseAcks = append(falseAcks, id)
			case q == full && errors.Is(err, idemq.ErrNacked):
				nacked = append(nacked, id)
			}
		}(i)
	}
	wg.Wait()
	t.Logf("%d publishes to the refusing queue: %d nacked, %d reported confirmed", n/2, len(nacked), len(falseAcks))
	if len(falseAcks) > 0 {
		t.Errorf("%d publishes the broker nacked (the queue takes none) returned nil: %v", len(falseAcks), falseAcks)
	}
	if len(nacked) == 0 {
		t.Errorf("no publish to the refusing queue was nacked: the test did not exercise nacks")
	}
}
