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
// quorum queue can be trusted while its leader's node dies: publishers
// keep publishing (with confirms) to a quorum queue led by node 2 and kill
// node 2 mid-stream; every message the broker confirmed must then be in
// the queue. One publisher is idemq's (all three URLs, a new connection
// after a nack), the other raw amqp091-go on node 3, which is never
// killed, one message at a time, a new connection after a nack or a close.
// A confirmed message missing from the queue is a broker finding, not
// idemq's: the raw publisher shows it without idemq's code.
//
// The queue has the arguments of idemq's quorum retry queues (a long TTL,
// at-least-once dead-lettering, reject-publish), so that it is the
// retry-queue case of TestClusterRetryNodeLoss without the expiry.
func TestClusterConfirmLeaderKill(t *testing.T) {
	cl := testenv.StartCluster(t, testenv.ClusterConfig{Rabbit: true})
	q := topology.Queue{Name: testenv.Name(t, "ccq"), Type: topology.Quorum, RetryDelays: []time.Duration{time.Hour}}
	plan := topology.ForQueue(q)
	target := plan.Retries[0].Name
	withClusterChannel(t, cl.AMQPURLs[1], func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(q.Name, true, false, false, false, plan.Args); err != nil {
			return err
		}
		_, err := ch.QueueDeclare(target, true, false, false, false, plan.Retries[0].Args)
		return err
	})
	leader := cl.Leader(target)
	t.Logf("%s led by node %d", target, leader)

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
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				id := "i-" + strconv.FormatInt(seq.Add(1), 10)
				pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
				err := pub.Publish(pctx, idemq.Message{ID: id, RoutingKey: target, Body: []byte(id)})
				pcancel()
				if err == nil {
					record(id)
				}
			}
		}()
	}
	// The raw publisher, on node 3 (never killed).
	raw := cl.AMQPURLs[2]
	if leader == 3 {
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

	// Read the queue back through a survivor.
	survivor := cl.AMQPURLs[0]
	if leader == 1 {
		survivor = cl.AMQPURLs[2]
	}
	in := map[string]int{}
	testenv.Eventually(t, 2*time.Minute, "the queue read back", func() bool {
		conn, err := amqp.Dial(survivor)
		if err != nil {
			return false
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return false
		}
		for {
			d, ok, err := ch.Get(target, true)
			if err != nil {
				return false
			}
			if !ok {
				return true
			}
			in[d.MessageId]++
		}
	})
	mu.Lock()
	defer mu.Unlock()
	var missing []string
	for _, a := range acks {
		if in[a.id] == 0 {
			missing = append(missing, fmt.Sprintf("%s confirmed %s (%+.3fs after the kill began)", a.id, a.at.Format("15:04:05.000"), a.at.Sub(killAt).Seconds()))
		}
	}
	sort.Strings(missing)
	t.Logf("%d confirmed, %d distinct in the queue, %d confirmed but missing", len(acks), len(in), len(missing))
	if len(missing) > 0 {
		t.Errorf("confirmed but not in the queue after the leader's node died: %d\n%v", len(missing), missing)
	}
}
