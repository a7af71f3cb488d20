package gate_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/gate"
	"github.com/idemq/idemq/internal/redistest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/topology"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// rig is an ingress queue (with its DLQ), a target exchange and an output
// queue bound to it with routing key "out", all named for the test.
type rig struct {
	ingress, dlq, exchange, out string
	prefix                      string
	store                       *redisstore.Store
}

func newRig(t *testing.T) *rig {
	t.Helper()
	testenv.RequireAMQP(t)
	rdb, prefix := testenv.Redis(t)
	r := &rig{
		ingress:  testenv.Name(t, "in"),
		exchange: testenv.Name(t, "x"),
		out:      testenv.Name(t, "out"),
		prefix:   prefix,
		store:    redistest.Store(t, rdb, redisstore.Config{KeyPrefix: prefix + ":"}),
	}
	r.dlq = r.ingress + ".dlq"
	ch := testenv.Channel(t)
	top := topology.Topology{
		Exchanges: []topology.Exchange{{Name: r.exchange, Type: "direct"}},
		Queues:    []topology.Queue{gate.IngressTopology(r.ingress), {Name: r.out, NoRetry: true, DLQ: "-"}},
		Bindings:  []topology.Binding{{Exchange: r.exchange, Queue: r.out, RoutingKey: "out"}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := topology.Declare(ctx, ch, top); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		testenv.DeleteQueue(r.ingress, r.dlq, r.out)
		if ch, err := amqpChannel(); err == nil {
			_ = ch.ExchangeDelete(r.exchange, false, false)
			ch.Close()
		}
	})
	return r
}

func amqpChannel() (*amqp.Channel, error) {
	conn, err := testenv.Dial(testenv.AMQPURL(), amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US"})
	if err != nil {
		return nil, err
	}
	return conn.Channel()
}

func (r *rig) config() gate.Config {
	return gate.Config{
		Ingress: r.ingress,
		Routes:  []gate.Route{{Exchange: r.exchange, RoutingKey: "out"}},
		Store:   r.store,
		Logger:  quiet(),
		Lease:   3 * time.Second,
		Workers: 8,
		Dial:    testenv.Dial,
	}
}

// start runs a gate until the test ends (or stop is called).
func start(t *testing.T, cfg gate.Config) (*gate.Gate, func()) {
	t.Helper()
	g, err := gate.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	select {
	case <-g.Ready():
	case err := <-done:
		t.Fatalf("gate stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("gate not ready")
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("gate.Run: %v", err)
				}
			case <-time.After(60 * time.Second):
				t.Error("gate did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return g, stop
}

// collect drains queue until n messages arrived (or the deadline), on
// one channel.
func collect(t *testing.T, queue string, n int, within time.Duration) []amqp.Delivery {
	t.Helper()
	ch := testenv.Channel(t)
	var got []amqp.Delivery
	testenv.Eventually(t, within, "messages in "+queue, func() bool {
		got = append(got, drain(t, ch, queue)...)
		return len(got) >= n
	})
	return got
}

func drain(t *testing.T, ch *amqp.Channel, queue string) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			t.Fatalf("get %s: %v", queue, err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
}

func ids(ds []amqp.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.MessageId
	}
	return out
}
