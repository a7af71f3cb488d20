package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
)

func TestGateFlags(t *testing.T) {
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(routes, []byte("routes:\n  - exchange: a\n  - exchange: b\n    routing_key: k\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		f      gateFlags
		err    string
		routes int
	}{
		{"to", gateFlags{from: "in", to: "x"}, "", 1},
		{"default exchange", gateFlags{from: "in", routingKey: "out"}, "", 1},
		{"routes file", gateFlags{from: "in", routes: routes}, "", 2},
		{"no from", gateFlags{to: "x"}, "--from", 0},
		{"no target", gateFlags{from: "in"}, "--to EXCHANGE or --routes", 0},
		{"both", gateFlags{from: "in", to: "x", routes: routes}, "use one", 0},
		{"missing routes file", gateFlags{from: "in", routes: routes + ".nope"}, "no such file", 0},
		{"two id sources", gateFlags{from: "in", to: "x", idHeader: "h", idJSON: "j"}, "use one", 0},
		{"short window", gateFlags{from: "in", to: "x", window: time.Second, lease: time.Second}, "twice Lease", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := gateConfig(tc.f)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(cfg.Routes) != tc.routes {
				t.Fatalf("routes %v", cfg.Routes)
			}
		})
	}
	if _, _, err := gateStore(context.Background(), slog.Default(), gateFlags{store: "cassandra"}, time.Hour); err == nil || !strings.Contains(err.Error(), "want redis") {
		t.Fatalf("unknown store: %v", err)
	}
	if _, _, err := gateStore(context.Background(), slog.Default(), gateFlags{store: "postgres"}, time.Hour); err == nil || !strings.Contains(err.Error(), "--db") {
		t.Fatalf("postgres without --db: %v", err)
	}
}

// topology apply declares the ingress queue and the bindings; idemq gate
// forwards each ID once and dead-letters a message without one; SIGTERM
// (the context) stops it cleanly.
func TestGateCommand(t *testing.T) {
	url := testenv.RequireAMQP(t)
	_, prefix := testenv.Redis(t)
	producers, target := testenv.Name(t, "px"), testenv.Name(t, "tx")
	ingress, out := testenv.Name(t, "in"), testenv.Name(t, "out")
	t.Cleanup(func() {
		testenv.DeleteQueue(ingress, ingress+".dlq", out)
		ch := testenv.Channel(t)
		_ = ch.ExchangeDelete(producers, false, false)
		_ = ch.ExchangeDelete(target, false, false)
	})
	mustRun(t, "", "topology", "apply", "--url", url, "-f", writeFile(t, `
exchanges:
  - name: `+producers+`
    type: topic
  - name: `+target+`
    type: topic
queues:
  - name: `+ingress+`
    no_retry: true
  - name: `+out+`
    no_retry: true
bindings:
  - exchange: `+producers+`
    queue: `+ingress+`
    routing_key: "orders.#"
  - exchange: `+target+`
    queue: `+out+`
    routing_key: "orders.#"
`))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := newRootCmd()
	var logs testenv.LogBuffer
	cmd.SetOut(&logs)
	cmd.SetErr(&logs)
	cmd.SetArgs([]string{"gate", "--from", ingress, "--to", target, "--amqp", url,
		"--redis-key-prefix", prefix + ":", "--lease", "3s", "--workers", "4", "--log-format", "text", "--log-interval", "100ms"})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	testenv.Eventually(t, 30*time.Second, "gate started", func() bool { return strings.Contains(logs.String(), "idemq gate started") })

	ch := testenv.Channel(t)
	var got []string
	testenv.Publish(t, producers, "orders.created", amqp.Publishing{MessageId: "o-1", Body: []byte("1")})
	testenv.Eventually(t, 30*time.Second, "o-1 forwarded", func() bool {
		for _, d := range drainCh(t, ch, out) {
			got = append(got, d.MessageId+"@"+d.RoutingKey)
		}
		return len(got) == 1
	})
	testenv.Publish(t, producers, "orders.created",
		amqp.Publishing{MessageId: "o-1", Body: []byte("1 again")},
		amqp.Publishing{MessageId: "o-2", Body: []byte("2")},
		amqp.Publishing{Body: []byte("no id")})
	var dl []amqp.Delivery
	testenv.Eventually(t, 30*time.Second, "forwarded and dead-lettered", func() bool {
		for _, d := range drainCh(t, ch, out) {
			got = append(got, d.MessageId+"@"+d.RoutingKey)
		}
		dl = append(dl, drainCh(t, ch, ingress+".dlq")...)
		return len(got) >= 2 && len(dl) >= 1 && strings.Contains(logs.String(), "duplicates=1")
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("gate: %v\n%s", err, logs.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("gate did not stop")
	}
	got = append(got, func() (s []string) {
		for _, d := range drainCh(t, ch, out) {
			s = append(s, d.MessageId)
		}
		return
	}()...)
	sort.Strings(got)
	if strings.Join(got, ",") != "o-1@orders.created,o-2@orders.created" {
		t.Fatalf("forwarded %v", got)
	}
	if len(dl) != 1 || dl[0].Headers[idemq.HeaderReason] != "missing-id" {
		t.Fatalf("dead letters %v", dl)
	}
	l := logs.String()
	if !strings.Contains(l, "drained and stopped") || !strings.Contains(l, "duplicates=1") || strings.Contains(l, "guest:guest@") {
		t.Fatalf("logs:\n%s", l)
	}
}

func drainCh(t *testing.T, ch *amqp.Channel, q string) []amqp.Delivery {
	t.Helper()
	var outs []amqp.Delivery
	for {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return outs
		}
		outs = append(outs, d)
	}
}
