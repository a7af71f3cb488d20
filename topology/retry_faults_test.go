//go:build faults

package topology_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/topology"
)

// restartRounds is how many broker restarts each case goes through.
const restartRounds = 3

// TestFaultRetryQueuesSurviveBrokerRestarts parks messages in retry queues
// (published as the retry policy publishes them: default exchange,
// persistent, confirmed) and restarts a private broker while they wait, so
// their TTL expires while the node stops, boots and recovers its queues.
// Every message must come back to the work queue: with the default quorum
// retry queues (at-least-once dead-lettering) none is lost. The classic
// rows measure the at-most-once dead-lettering of idemq's former retry
// queues and only log what they lose (set IDEMQ_FAULT_STRICT_CLASSIC=1 to
// make them fail on a loss).
func TestFaultRetryQueuesSurviveBrokerRestarts(t *testing.T) {
	node := testenv.StartPrivateRabbit(t, testenv.RabbitNodeConfig{})
	cases := []struct {
		name     string
		work     topology.QueueType
		retry    topology.QueueType
		mustKeep bool
	}{
		{"quorum work, default retry", topology.Quorum, "", true},
		{"classic work, default retry", topology.Classic, "", true},
		{"quorum work, classic retry", topology.Quorum, topology.Classic, os.Getenv("IDEMQ_FAULT_STRICT_CLASSIC") != ""},
		{"classic work, classic retry", topology.Classic, topology.Classic, os.Getenv("IDEMQ_FAULT_STRICT_CLASSIC") != ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q := topology.Queue{
				Name:        testenv.Name(t, "rq"),
				Type:        tc.work,
				RetryType:   tc.retry,
				RetryDelays: []time.Duration{time.Second, 3 * time.Second, 6 * time.Second},
			}
			plan := topology.ForQueue(q)
			withChannel(t, node.URL, func(ch *amqp.Channel) error {
				return topology.Declare(context.Background(), ch, topology.Topology{Queues: []topology.Queue{q}})
			})
			sent := 0
			for round := 0; round < restartRounds; round++ {
				// Spread over every retry queue; the last batch right
				// before the restart, so expiries fall into the stop,
				// the boot and the recovery.
				withChannel(t, node.URL, func(ch *amqp.Channel) error {
					if err := ch.Confirm(false); err != nil {
						return err
					}
					for i := 0; i < 300; i++ {
						r := plan.Retries[i%len(plan.Retries)]
						id := fmt.Sprintf("m-%d-%d", round, i)
						dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", r.Name, true, false, amqp.Publishing{
							MessageId: id, DeliveryMode: amqp.Persistent, Body: []byte(id),
							Headers: amqp.Table{"x-idemq-attempt": int64(2), "x-idemq-queue": q.Name},
						})
						if err != nil {
							return err
						}
						if !dc.Wait() {
							return fmt.Errorf("publish %s to %s nacked", id, r.Name)
						}
						sent++
					}
					return nil
				})
				node.Restart(t)
			}
			// Wait until the retry queues are empty and the work queue
			// stops growing, then count what came back.
			var lastN int
			var stableSince time.Time
			testenv.Eventually(t, 3*time.Minute, "retry queues drained", func() bool {
				waiting, n := 0, 0
				err := withChannelErr(node.URL, func(ch *amqp.Channel) error {
					for _, r := range plan.Retries {
						qi, err := ch.QueueDeclarePassive(r.Name, true, false, false, false, r.Args)
						if err != nil {
							return err
						}
						waiting += qi.Messages
					}
					qi, err := ch.QueueDeclarePassive(q.Name, true, false, false, false, plan.Args)
					n = qi.Messages
					return err
				})
				if err != nil || waiting > 0 {
					return false
				}
				if n != lastN || stableSince.IsZero() {
					lastN, stableSince = n, time.Now()
					return false
				}
				return time.Since(stableSince) > 3*time.Second
			})
			seen := map[string]int{}
			withChannel(t, node.URL, func(ch *amqp.Channel) error {
				for {
					d, ok, err := ch.Get(q.Name, true)
					if err != nil || !ok {
						return err
					}
					seen[d.MessageId]++
				}
			})
			dups := 0
			for _, c := range seen {
				dups += c - 1
			}
			lost := sent - len(seen)
			t.Logf("work %s, retry %v: sent %d through %d restarts, back %d distinct, lost %d, duplicates %d",
				tc.work, plan.Retries[0].Args[topology.ArgQueueType], sent, restartRounds, len(seen), lost, dups)
			if lost != 0 && tc.mustKeep {
				t.Errorf("%d of %d messages waiting in retry queues lost through %d broker restarts", lost, sent, restartRounds)
			}
			withChannel(t, node.URL, func(ch *amqp.Channel) error {
				for _, r := range plan.Retries {
					if _, err := ch.QueueDelete(r.Name, false, false, false); err != nil {
						return err
					}
				}
				_, err := ch.QueueDelete(q.Name, false, false, false)
				return err
			})
		})
	}
	if out, err := node.Ctl("status"); err != nil {
		t.Fatalf("node unhealthy after the restarts: %v\n%s", err, out)
	}
	if crash := crashReports(t, node); crash != "" {
		t.Errorf("broker logged dead-letter worker crashes through restarts alone:\n%s", crash)
	}
}

// crashReports returns the crash and supervisor reports of the node's log
// that concern dead-lettering (the at-least-once dead-letter worker,
// rabbit_fifo_dlx_worker). "leader not known. Command is dropped" lines are
// the classic rows' losses, measured by the counts, not a crash.
func crashReports(t *testing.T, node *testenv.PrivateNode) string {
	t.Helper()
	dir := node.LogDir
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			l := strings.ToLower(line)
			if (strings.Contains(l, "crash") || strings.Contains(l, "supervisor")) && strings.Contains(l, "dlx") {
				b.WriteString(line + "\n")
			}
		}
	}
	return b.String()
}

func withChannel(t *testing.T, url string, f func(ch *amqp.Channel) error) {
	t.Helper()
	if err := withChannelErr(url, f); err != nil {
		t.Fatal(err)
	}
}

func withChannelErr(url string, f func(ch *amqp.Channel) error) error {
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return f(ch)
}
