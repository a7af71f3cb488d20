//go:build faults

package idemq_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/topology"
)

// TestClusterConfirmLeaderKill asks whether a publisher confirm from a
// quorum retry queue can be trusted while its leader's node dies:
// publishers keep publishing (with confirms) to a quorum queue declared as
// idemq's retry queues are (TTL 2 s, at-least-once dead-lettering to the
// work queue, reject-publish) and led by node 2, and node 2 is killed
// mid-stream; every message the broker confirmed must then come through
// the work queue (led by node 1). One publisher is idemq's (all three
// URLs, a new connection after a nack; half its messages go to the work
// queue directly), the other raw amqp091-go on a node that is
// never killed, one message at a time, a new connection after a nack or a
// close. It is TestClusterRetryNodeLoss without idemq's consumer, retry
// policy and inbox: a confirmed message missing here is lost between the
// publisher and the work queue.
func TestClusterConfirmLeaderKill(t *testing.T) {
	cl := testenv.StartCluster(t, testenv.ClusterConfig{Rabbit: true})
	q := topology.Queue{Name: testenv.Name(t, "ccq"), Type: topology.Quorum, RetryDelays: []time.Duration{2 * time.Second}}
	plan := topology.ForQueue(q)
	target := plan.Retries[0].Name
	// The work queue on node 1, the retry queue on node 2 (quorum
	// leaders go to the declaring node).
	withClusterChannel(t, cl.AMQPURLs[0], func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(q.Name, true, false, false, false, plan.Args)
		return err
	})
	withClusterChannel(t, cl.AMQPURLs[1], func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(target, true, false, false, false, plan.Retries[0].Args)
		return err
	})
	leader := cl.Leader(target)
	t.Logf("%s led by node %d", target, leader)

	// Everything dead-lettered to the work queue, read as it comes (on
	// node 1, or 3 when node 1 leads the retry queue: never the victim).
	var inMu sync.Mutex
	in := map[string]int{}
	reader := cl.AMQPURLs[0]
	if leader == 1 {
		reader = cl.AMQPURLs[2]
	}
	rctx, rcancel := context.WithCancel(context.Background())
	defer rcancel()
	go func() {
		for rctx.Err() == nil {
			conn, err := amqp.Dial(reader)
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			ch, err := conn.Channel()
			var ds <-chan amqp.Delivery
			if err == nil {
				ds, err = ch.Consume(q.Name, "", true, false, false, false, nil)
			}
			if err != nil {
				conn.Close()
				continue
			}
		read:
			for {
				select {
				case d, ok := <-ds:
					if !ok {
						break read
					}
					inMu.Lock()
					in[d.MessageId]++
					inMu.Unlock()
				case <-rctx.Done():
					break read
				}
			}
			conn.Close()
		}
	}()

	type ack struct {
		id string
		at time.Time
	}
	var mu sync.Mutex
	var acks []ack
	var nacks, lostConns atomic.Int64
	record := func(id string) {
		mu.Lock()
		acks = append(acks, ack{id, time.Now()})
		mu.Unlock()
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup

	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URLs: cl.AMQPURLs, Logger: quietLogger(), Retry: backoffFast(), Heartbeat: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	var seq atomic.Int64
	// Half of idemq's publishes go straight to the work queue, as a
	// consumer's retries and new messages share one publisher: on one
	// channel, acks from the live work queue then mix with the answers
	// from the retry queue being re-elected (TestPublishNackNotTurnedIntoAck).
	for w := 0; w < 16; w++ {
		key := target
		if w%2 == 1 {
			key = q.Name
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				id := "i-" + strconv.FormatInt(seq.Add(1), 10)
				pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
				err := pub.Publish(pctx, idemq.Message{ID: id, RoutingKey: key, Body: []byte(id)})
				pcancel()
				if err == nil {
					record(id)
				}
			}
		}()
	}
	// The raw publisher, on node 3 (never killed).
	raw := cl.AMQPURLs[2]
	if leader == 3 { // not expected: node 2 declared it
		raw = cl.AMQPURLs[0]
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		n := 0
		for ctx.Err() == nil {
			conn, err := amqp.Dial(raw)
			if err != nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			ch, err := conn.Channel()
			if err == nil {
				err = ch.Confirm(false)
			}
			if err != nil {
				conn.Close()
				continue
			}
			confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
			for ctx.Err() == nil {
				n++
				id := "r-" + strconv.Itoa(n)
				if err := ch.PublishWithContext(ctx, "", target, true, false, amqp.Publishing{MessageId: id, Body: []byte(id), DeliveryMode: amqp.Persistent}); err != nil {
					break
				}
				c, ok := <-confirms
				if !ok {
					lostConns.Add(1)
					break
				}
				if !c.Ack {
					nacks.Add(1)
					break
				}
				record(id)
			}
			conn.Close()
		}
	}()

	count := func() int { mu.Lock(); defer mu.Unlock(); return len(acks) }
	testenv.Eventually(t, 2*time.Minute, "500 confirmed before the kill", func() bool { return count() >= 500 })
	killAt := time.Now()
	cl.Run("kill", strconv.Itoa(leader))
	killed := time.Now()
	before := count()
	testenv.Eventually(t, 2*time.Minute, "1000 more confirmed after the kill", func() bool { return count() >= before+1000 })
	cancel()
	wg.Wait()
	t.Logf("kill of node %d ran %s..%s; %d confirmed (%d before the kill), raw publisher: %d nacks, %d connections lost",
		leader, killAt.Format("15:04:05.000"), killed.Format("15:04:05.000"), count(), before, nacks.Load(), lostConns.Load())

	// Every confirmed message must come through the work queue.
	var lastN int
	var still time.Time
	testenv.Eventually(t, 5*time.Minute, "every confirmed message dead-lettered to the work queue, or 30 s without progress", func() bool {
		inMu.Lock()
		n := 0
		mu.Lock()
		for _, a := range acks {
			if in[a.id] > 0 {
				n++
			}
		}
		all := len(acks)
		mu.Unlock()
		inMu.Unlock()
		if n == all {
			return true
		}
		if n != lastN || still.IsZero() {
			lastN, still = n, time.Now()
			return false
		}
		return time.Since(still) > 30*time.Second
	})
	rcancel()
	inMu.Lock()
	defer inMu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	var missing []string
	for _, a := range acks {
		if in[a.id] == 0 {
			missing = append(missing, fmt.Sprintf("%s confirmed %s (%+.3fs after the kill began)", a.id, a.at.Format("15:04:05.000"), a.at.Sub(killAt).Seconds()))
		}
	}
	sort.Strings(missing)
	t.Logf("%d confirmed, %d distinct through the work queue, %d confirmed but missing", len(acks), len(in), len(missing))
	if len(missing) > 0 {
		t.Errorf("confirmed to the retry queue but never dead-lettered to the work queue after its leader's node died: %d\n%v", len(missing), missing)
	}
}
