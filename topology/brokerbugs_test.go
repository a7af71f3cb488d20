//go:build faults && brokerbugs

package topology_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/topology"
)

// TestBrokerDeleteAtLeastOnceQueuesAfterRestart probes a RabbitMQ defect,
// not idemq (make broker-bugs; not part of make test): at-least-once retry
// queues holding messages, some expiring and their dead-letter target
// deleted first, deleted right after a node restart. On RabbitMQ 3.10.8
// the dead-letter worker crashes (rabbit_fifo_dlx_worker badmatch
// not_found), its supervisor reaches its restart intensity and stops, and
// the node nacks every publish to a new at-least-once queue until it is
// restarted (docs/RABBITMQ_VERSIONS.md). The test fails while the broker
// has the defect; it passes on a broker without it.
func TestBrokerDeleteAtLeastOnceQueuesAfterRestart(t *testing.T) {
	node := testenv.StartPrivateRabbit(t, testenv.RabbitNodeConfig{})
	defer func() {
		if crash := crashReports(t, node); crash != "" {
			t.Logf("broker logged dead-letter worker crash reports:\n%s", crash)
		}
	}()
	// The 3.10.8 failure noted in docs/GUARANTEES.md: at-least-once retry
	// queues holding messages (some expiring, their dead-letter target
	// deleted first) deleted at once after a restart.
	q := topology.Queue{Name: testenv.Name(t, "rd"), Type: topology.Quorum,
		RetryDelays: []time.Duration{200 * time.Millisecond, time.Minute}}
	plan := topology.ForQueue(q)
	withChannel(t, node.URL, func(ch *amqp.Channel) error {
		if err := topology.Declare(context.Background(), ch, topology.Topology{Queues: []topology.Queue{q}}); err != nil {
			return err
		}
		if err := ch.Confirm(false); err != nil {
			return err
		}
		for i := 0; i < 400; i++ {
			r := plan.Retries[i%len(plan.Retries)]
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", r.Name, true, false,
				amqp.Publishing{MessageId: fmt.Sprint(i), DeliveryMode: amqp.Persistent})
			if err != nil {
				return err
			}
			dc.Wait()
		}
		return nil
	})
	node.Restart(t)
	withChannel(t, node.URL, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDelete(q.Name, false, false, false); err != nil {
			return err
		}
		for _, r := range plan.Retries {
			if _, err := ch.QueueDelete(r.Name, false, false, false); err != nil {
				return err
			}
		}
		return nil
	})
	// Dead-lettering must still work on the node afterwards: a new
	// at-least-once retry queue hands every expired message back to
	// its work queue.
	fresh := topology.Queue{Name: testenv.Name(t, "probe"), Type: topology.Quorum,
		RetryDelays: []time.Duration{100 * time.Millisecond}}
	fp := topology.ForQueue(fresh)
	const probes = 50
	testenv.Eventually(t, time.Minute, "node declares a new at-least-once retry topology", func() bool {
		return withChannelErr(node.URL, func(ch *amqp.Channel) error {
			return topology.Declare(context.Background(), ch, topology.Topology{Queues: []topology.Queue{fresh}})
		}) == nil
	})
	withChannel(t, node.URL, func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		for i := 0; i < probes; i++ {
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", fp.Retries[0].Name, true, false,
				amqp.Publishing{MessageId: fmt.Sprint("p", i), DeliveryMode: amqp.Persistent})
			if err != nil {
				return err
			}
			if !dc.Wait() {
				return fmt.Errorf("probe %d nacked", i)
			}
		}
		return nil
	})
	testenv.Eventually(t, time.Minute, "every probe dead-lettered back to the new work queue", func() bool {
		n := -1
		_ = withChannelErr(node.URL, func(ch *amqp.Channel) error {
			qi, err := ch.QueueDeclarePassive(fp.Queue, true, false, false, false, fp.Args)
			n = qi.Messages
			return err
		})
		return n == probes
	})
}
