package idemq_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/internal/testenv"
)

// deadURL is an AMQP URL with a password on a loopback port nobody listens on.
func deadURL(t *testing.T, secret string) string {
	return fmt.Sprintf("amqp://guest:%s@127.0.0.1:%d/", secret, testenv.FreePort(t))
}

func logger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// urlRecorder is a Config.Dial that notes every URL it is asked for.
type urlRecorder struct {
	mu   sync.Mutex
	urls []string
}

func (r *urlRecorder) dial(u string, cfg amqp.Config) (*amqp.Connection, error) {
	r.mu.Lock()
	r.urls = append(r.urls, u)
	r.mu.Unlock()
	return testenv.Dial(u, cfg)
}

func (r *urlRecorder) tried() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.urls...)
}

// A consumer and a publisher given a list of brokers of which only one runs
// go to that one, whatever the shuffled order, within one pass: the dead
// nodes cost a refused connection each, not a backoff.
func TestFailoverToTheNodeThatAnswers(t *testing.T) {
	live := testenv.RequireAMQP(t)
	queue := testenv.Queue(t, nil)
	for round := 0; round < 3; round++ {
		urls := []string{deadURL(t, "x"), live, deadURL(t, "y")}
		var pd urlRecorder
		p, err := idemq.NewPublisher(idemq.PublisherConfig{URLs: urls, Dial: pd.dial, Logger: quietLogger(),
			MaxAttempts: 1, Retry: backoff.Policy{Min: time.Hour}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = p.Publish(ctx, idemq.Message{ID: fmt.Sprintf("m-%d", round), RoutingKey: queue, Body: []byte("x")})
		cancel()
		p.Close()
		if err != nil {
			t.Fatalf("round %d: publish with one live broker of three: %v", round, err)
		}
		if tried := pd.tried(); len(tried) == 0 || tried[len(tried)-1] != live {
			t.Fatalf("round %d: dialled %v, want the live broker last", round, tried)
		}
	}

	tr := newTracker()
	var cd urlRecorder
	_, stop := runConsumer(t, idemq.ConsumerConfig{Queue: queue, URLs: []string{deadURL(t, "x"), deadURL(t, "y"), live},
		Dial: cd.dial, Reconnect: backoff.Policy{Min: time.Hour}},
		idemq.HandlerFunc(func(_ context.Context, d *idemq.Delivery) error {
			tr.add(d.MessageID)
			return nil
		}))
	testenv.Eventually(t, 60*time.Second, "3 messages consumed", func() bool { return tr.distinct() == 3 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := len(cd.tried()); n > 3 {
		t.Fatalf("the consumer dialled %d times (%v), want one pass of at most 3", n, cd.tried())
	}
}

// When no broker of the list answers, the error names every URL tried,
// redacted, and no password.
func TestFailoverAllDownNamesEachURL(t *testing.T) {
	const secret = "Pl4nted-S3cret"
	urls := []string{deadURL(t, secret), deadURL(t, secret), deadURL(t, secret)}
	var logs lockedBuffer
	p, err := idemq.NewPublisher(idemq.PublisherConfig{URLs: urls, MaxAttempts: 2, Logger: logger(&logs),
		Retry: backoff.Policy{Min: time.Millisecond, Max: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = p.Publish(ctx, idemq.Message{ID: "m-1", RoutingKey: "q", Body: []byte("x")})
	if err == nil {
		t.Fatal("publish with every broker down succeeded")
	}
	msg := err.Error()
	if showsSecret(msg+logs.String(), secret) {
		t.Fatalf("the error shows the password: %v", err)
	}
	for _, u := range urls {
		host := u[strings.Index(u, "@")+1:]
		if !strings.Contains(msg, "guest:xxxxx@"+host) {
			t.Errorf("the error does not name %s (redacted): %v", host, err)
		}
	}
	if !strings.Contains(msg, "no broker reachable") {
		t.Errorf("error %q does not say no broker was reachable", msg)
	}

	// The consumer logs the same on each failed pass.
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{URLs: urls, Queue: "q", Logger: logger(&logs),
		Reconnect: backoff.Policy{Min: time.Millisecond, Max: time.Millisecond},
		Pipeline:  idemq.Pipeline{Handler: idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil })}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(rctx); close(done) }()
	testenv.Eventually(t, 30*time.Second, "a failed pass logged", func() bool {
		return strings.Contains(logs.String(), "no broker reachable")
	})
	rcancel()
	<-done
	if showsSecret(logs.String(), secret) {
		t.Fatalf("the consumer's log shows the password:\n%s", logs.String())
	}
}

// A nacked publish retires its channel and connection: the retry dials a
// new one. (RabbitMQ 3.10 keeps nacking a channel that published to a
// quorum queue whose leader died; a new channel publishes at once. A queue
// that rejects publishes when full nacks here on one node.)
func TestNackedPublishRetriesOnANewConnection(t *testing.T) {
	testenv.RequireRealBroker(t, "needs a nacked publish (x-max-length with reject-publish); the fake confirms every publish")
	testenv.RequireAMQP(t)
	queue := testenv.Queue(t, amqp.Table{"x-max-length": int64(0), "x-overflow": "reject-publish"})
	var d urlRecorder
	var rec idemq.Counters
	p, err := idemq.NewPublisher(idemq.PublisherConfig{Dial: d.dial, MaxAttempts: 3, Recorder: &rec, Logger: quietLogger(),
		Retry: backoff.Policy{Min: time.Millisecond, Max: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = p.Publish(ctx, idemq.Message{ID: "m-1", RoutingKey: queue, Body: []byte("x")})
	if !errors.Is(err, idemq.ErrNacked) {
		t.Fatalf("publish to a full reject-publish queue: %v, want ErrNacked", err)
	}
	if n := len(d.tried()); n != 3 {
		t.Fatalf("3 nacked attempts dialled %d time(s), want 3 (a new connection after each nack)", n)
	}
}
