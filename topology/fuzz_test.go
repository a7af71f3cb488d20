package topology_test

import (
	"bytes"
	"os"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"gopkg.in/yaml.v3"

	"github.com/idemq/idemq/topology"
)

// FuzzParseTopology: parsing and validating any YAML never panics, and a
// topology Load accepts plans arguments the broker can be sent, with names
// AMQP allows, and round-trips: marshalled again it loads to the same thing.
func FuzzParseTopology(f *testing.F) {
	if example, err := os.ReadFile("testdata/example.yaml"); err == nil {
		f.Add(string(example))
	}
	for _, s := range []string{
		"",
		"queues:\n  - name: a\n",
		"queues:\n  - name: a\n    type: quorum\n    delivery_limit: -1\n    dlq: \"-\"\n    no_retry: true\n",
		"queues:\n  - name: a\n    dlq: shared.dlq\n    retry_delays: [1ns, 1ms, 1h]\n    args: {x-message-ttl: 60000, x-max-length: 10, x-overflow: reject-publish}\n",
		"queues:\n  - name: a\n    args: {x-queue-type: quorum}\n",
		"queues:\n  - name: a\n    args: {x-message-ttl: 1h}\n",
		"queues:\n  - name: a\n    dlq: a\n",
		"queues:\n  - name: a\n---\nqueues:\n  - name: b\n",
		"exchanges:\n  - name: e\n    type: headers\n    args: {alternate-exchange: ae}\nbindings:\n  - exchange: e\n    queue: a\n    args: {x-match: all, k: [1, \"two\", {x: 3}]}\n",
		"queues: [{name: a, args: {x: &a [*a]}}]\n",
		"queues:\n  - name: a\n    retry_delays: [0s]\n",
		"queues: !!map {}\n",
		"{queues: [{name: \"\\u0000\", args: {\"\": null, f: 1.5e300, t: 2001-12-14t21:59:43.10-05:00}}]}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		top, err := topology.Load(strings.NewReader(in))
		if err != nil {
			return
		}
		for _, q := range top.Queues {
			p := topology.ForQueue(q)
			for _, args := range []amqp.Table{p.Args, p.DLQArgs} {
				if err := args.Validate(); err != nil {
					t.Fatalf("accepted queue %q plans arguments the broker cannot be sent: %v", q.Name, err)
				}
			}
			names := []string{p.Queue, p.DLQ}
			for _, r := range p.Retries {
				names = append(names, r.Name)
			}
			for _, n := range names {
				if len(n) > topology.MaxNameLength {
					t.Fatalf("accepted queue %q plans a %d-byte name", q.Name, len(n))
				}
			}
			if q.Type == topology.Quorum && q.DeliveryLimit >= 0 && p.DeliveryLimit <= 0 {
				t.Fatalf("quorum queue %q planned without a delivery limit", q.Name)
			}
			if p.Args[topology.ArgQueueType] != string(p.Type) {
				t.Fatalf("queue %q: plan type %q, x-queue-type %v", q.Name, p.Type, p.Args[topology.ArgQueueType])
			}
		}
		out, err := yaml.Marshal(top)
		if err != nil {
			t.Fatalf("marshal an accepted topology: %v", err)
		}
		again, err := topology.Load(bytes.NewReader(out))
		if err != nil {
			t.Fatalf("an accepted topology does not load again: %v\n%s", err, out)
		}
		out2, err := yaml.Marshal(again)
		if err != nil || !bytes.Equal(out, out2) {
			t.Fatalf("round trip differs (%v):\n%s\n----\n%s", err, out, out2)
		}
	})
}
