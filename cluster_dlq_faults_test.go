//go:build faults

package idemq_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/topology"
)

// TestFaultClusterNodeLoss is make test's node-loss run on one private
// 3-node cluster: the two cases of TestClusterRetryNodeLoss (a node lost
// while deliveries wait in retry queues, 300 messages each), then a
// dead-letter queue's node killed (kill -9) while messages fail for good.
//
// "classic DLQ held": a classic DLQ lives on one node. While it is down the
// broker returns dead letters to it NO_ROUTE; the retry policy used to
// reject them to the broker, whose dead-letter route leads to the same
// queue, and they were dropped. Now they are held back and reach the DLQ
// once its node is back, without the handler running again.
//
// "quorum DLQ, consumer on the lost node": the default DLQ is a quorum
// queue. A consumer connected to the lost node reconnects to another one,
// its Setup declares the topology again (a classic DLQ whose node is down
// made that fail on every node, so no consumer could reconnect), and dead
// letters reach the DLQ while the node is still down.
func TestFaultClusterNodeLoss(t *testing.T) {
	cl := testenv.StartCluster(t, testenv.ClusterConfig{Rabbit: true})
	clusterRetryCases(t, cl, 300, 1)
	t.Run("classic DLQ held", func(t *testing.T) { runClusterDLQLoss(t, cl, true) })
	t.Run("quorum DLQ, consumer on the lost node", func(t *testing.T) { runClusterDLQLoss(t, cl, false) })
}

func runClusterDLQLoss(t *testing.T, cl *testenv.Cluster, classic bool) {
	const node = 3 // the node killed: it holds the DLQ (classic) or every leader (quorum)
	urls := cl.AMQPURLs
	q := topology.Queue{Name: testenv.Name(t, "dlqloss"), Type: topology.Quorum,
		RetryDelays: []time.Duration{500 * time.Millisecond}}
	// The consumer is on the node to lose until it is lost (the consumer
	// tries its URLs in a random order: the others refuse until then), or,
	// with a classic DLQ, never on it (it keeps consuming).
	var lost atomic.Bool
	dial := func(u string, cfg amqp.Config) (*amqp.Connection, error) {
		if !classic && u != urls[node-1] && !lost.Load() {
			return nil, fmt.Errorf("test: %s refused until node %d is lost", u, node)
		}
		return amqp.DialConfig(u, cfg)
	}
	consumerURLs := urls
	if classic {
		q.DLQType = topology.Classic
		consumerURLs = urls[:2]
	}
	top := topology.Topology{Queues: []topology.Queue{q}}
	plan := topology.ForQueue(q)
	// Declared through the node to lose: the classic DLQ lives there, and
	// quorum queues get their leader there.
	withClusterChannel(t, urls[node-1], func(ch *amqp.Channel) error { return topology.Declare(context.Background(), ch, top) })

	fast := backoffFast()
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URLs: urls[:2], Logger: quietLogger(), Retry: fast, Heartbeat: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	policy, err := retry.New(retry.ForTopology(q, retry.Config{Sender: pub, QuickAttempts: 1,
		PublishTimeout: 20 * time.Second, PublishRetryAfter: 200 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[string]int{}
	applied := map[string]bool{}
	h := idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		runs[d.MessageID]++
		if strings.HasPrefix(d.MessageID, "bad-") {
			return idemq.Permanent(errors.New("malformed " + d.MessageID))
		}
		applied[d.MessageID] = true
		return nil
	})
	var rec idemq.Counters
	_, stop := runConsumer(t, idemq.ConsumerConfig{URLs: consumerURLs, Dial: dial, Queue: q.Name, Setup: topology.SetupFunc(top),
		Workers: 4, Prefetch: 50, Recorder: &rec, Reconnect: fast, Heartbeat: 2 * time.Second,
		Pipeline: idemq.Pipeline{Policy: policy}}, h)
	defer stop()

	var bad, good []string
	publish := func(round, n int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for i := 0; i < n; i++ {
			for _, kind := range []string{"bad", "good"} {
				id := fmt.Sprintf("%s-%d-%d", kind, round, i)
				if err := pub.Publish(ctx, idemq.Message{ID: id, RoutingKey: q.Name, Body: []byte(id)}); err != nil {
					t.Fatalf("publish %s: %v", id, err)
				}
				if kind == "bad" {
					bad = append(bad, id)
				} else {
					good = append(good, id)
				}
			}
		}
	}
	dlqDepth := func() int { n, _ := clusterDepth(urls, node, plan.DLQ); return n }
	allApplied := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(applied) == len(good)
	}

	publish(0, 10)
	testenv.Eventually(t, 2*time.Minute, "the first round applied and dead-lettered", func() bool {
		return allApplied() && dlqDepth() == len(bad)
	})
	lost.Store(true)
	cl.Run("kill", fmt.Sprint(node))
	publish(1, 20)
	if classic {
		// The DLQ is unavailable: the dead letters are held, none dropped.
		testenv.Eventually(t, 2*time.Minute, "the good ones applied and every bad one held", func() bool {
			return allApplied() && rec.Get(retry.CountDeadLetterHeld) >= 20
		})
		if n := rec.Get(idemq.CountRejected); n != 0 {
			t.Fatalf("%d deliveries rejected to the broker while the DLQ's node was down: dropped", n)
		}
		cl.Run("start", fmt.Sprint(node))
	}
	testenv.Eventually(t, 3*time.Minute, fmt.Sprintf("%d dead letters in %s", len(bad), plan.DLQ), func() bool {
		return allApplied() && dlqDepth() >= len(bad)
	})
	if !classic && rec.Get(idemq.CountReconnects) == 0 {
		t.Fatalf("the consumer never reconnected: it was not on the lost node")
	}
	// Every bad message dead-lettered (a copy may come twice: at least
	// once), the handler ran once per message, nothing left behind.
	var got []string
	withClusterChannel(t, urls[0], func(ch *amqp.Channel) error {
		for {
			d, ok, err := ch.Get(plan.DLQ, true)
			if err != nil || !ok {
				return err
			}
			if r, _ := d.Headers[idemq.HeaderReason].(string); r != idemq.ReasonPermanent {
				return fmt.Errorf("dead letter %s: reason %q", d.MessageId, r)
			}
			got = append(got, d.MessageId)
		}
	})
	seen := map[string]bool{}
	for _, id := range got {
		seen[id] = true
	}
	var missing []string
	for _, id := range bad {
		if !seen[id] {
			missing = append(missing, id)
		}
	}
	sort.Strings(missing)
	mu.Lock()
	defer mu.Unlock()
	reran := 0
	for _, n := range runs {
		if n > 1 {
			reran++
		}
	}
	t.Logf("%d bad, %d good: %d dead letters (%d distinct), %d applied; held %d, rejected %d, reconnects %d, handler reruns %d",
		len(bad), len(good), len(got), len(seen), len(applied), rec.Get(retry.CountDeadLetterHeld), rec.Get(idemq.CountRejected),
		rec.Get(idemq.CountReconnects), reran)
	if len(missing) > 0 {
		t.Fatalf("%d dead letters lost: %v", len(missing), missing)
	}
	if len(seen) != len(got) {
		t.Logf("%d dead letters came twice (at least once)", len(got)-len(seen))
	}
	if n, err := clusterDepth(urls, 0, q.Name, plan.Retries[0].Name); err != nil || n != 0 {
		t.Fatalf("%d left in the work and retry queues (%v)", n, err)
	}
}
