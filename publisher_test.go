package idemq_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
)

func TestPublishRequiresAnID(t *testing.T) {
	p, err := idemq.NewPublisher(idemq.PublisherConfig{Logger: quietLogger(), Dial: testenv.Dial})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	err = p.Publish(context.Background(), idemq.Message{RoutingKey: "x"})
	if !errors.Is(err, idemq.ErrMissingMessageID) {
		t.Fatalf("err = %v, want ErrMissingMessageID", err)
	}
	err = p.Publish(context.Background(), idemq.Message{ID: "bad\nid", RoutingKey: "x"})
	if !errors.Is(err, idemq.ErrInvalidMessageID) {
		t.Fatalf("err = %v, want ErrInvalidMessageID", err)
	}
	// A header AMQP cannot encode fails at once, without a retry loop that
	// would last until the context ends.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	err = p.Publish(ctx, idemq.Message{ID: "m1", RoutingKey: "x", Headers: amqp.Table{"bad": struct{}{}}})
	if !errors.Is(err, idemq.ErrInvalidHeaders) || time.Since(start) > 5*time.Second {
		t.Fatalf("err = %v after %v, want ErrInvalidHeaders at once", err, time.Since(start))
	}
}

func TestPublishConfirmedAndPersistent(t *testing.T) {
	testenv.RequireAMQP(t)
	queue := testenv.Queue(t, nil)
	p, err := idemq.NewPublisher(idemq.PublisherConfig{Logger: quietLogger(), Dial: testenv.Dial})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	headers := amqp.Table{"k": "v", idemq.HeaderPublishSeq: int64(12345)} // a stale value, as a republish carries
	if err := p.Publish(ctx, idemq.Message{ID: "order-1", RoutingKey: queue, Body: []byte("x"), Headers: headers}); err != nil {
		t.Fatal(err)
	}
	if len(headers) != 2 || headers[idemq.HeaderPublishSeq] != int64(12345) {
		t.Fatalf("the caller's headers were modified: %v", headers)
	}
	got := testenv.Drain(t, queue)
	if len(got) != 1 || got[0].MessageId != "order-1" || got[0].DeliveryMode != 2 || got[0].Headers["k"] != "v" {
		t.Fatalf("got %+v", got)
	}
	// The stale sequence number was dropped, and a publish whose ID is
	// not in flight twice carries no header of idemq's: a header table
	// costs the broker a fifth of its publish rate.
	if seq, ok := got[0].Headers[idemq.HeaderPublishSeq]; ok || len(got[0].Headers) != 1 {
		t.Fatalf("headers %v (%s = %v), want only the caller's", got[0].Headers, idemq.HeaderPublishSeq, seq)
	}
}

func TestPublishUnroutableIsAnError(t *testing.T) {
	testenv.RequireAMQP(t)
	p, err := idemq.NewPublisher(idemq.PublisherConfig{Logger: quietLogger(), Dial: testenv.Dial})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Concurrent routable and unroutable publishes: each gets its own answer.
	queue := testenv.Queue(t, nil)
	var wg sync.WaitGroup
	errs := make([]error, 40)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := queue
			if i%2 == 1 {
				key = testenv.Name(t, "nowhere")
			}
			errs[i] = p.Publish(ctx, idemq.Message{ID: fmt.Sprintf("m-%d", i), RoutingKey: key})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if i%2 == 0 && err != nil {
			t.Fatalf("routable publish %d: %v", i, err)
		}
		if i%2 == 1 {
			var re *idemq.ReturnedError
			if !errors.As(err, &re) || !errors.Is(err, idemq.ErrUnroutable) || re.MessageID != fmt.Sprintf("m-%d", i) {
				t.Fatalf("unroutable publish %d: err = %v", i, err)
			}
		}
	}
	if got := len(testenv.Drain(t, queue)); got != 20 {
		t.Fatalf("queue has %d messages, want 20", got)
	}
}

// The publisher loses nothing when its connection is killed mid-stream:
// every message it reported as confirmed is in the queue.
func TestPublisherSurvivesConnectionCuts(t *testing.T) {
	testenv.RequireRealBroker(t, "cuts TCP connections through a proxy")
	proxy, url := testenv.AMQPProxy(t)
	queue := testenv.Queue(t, nil)
	var rec idemq.Counters
	p, err := idemq.NewPublisher(idemq.PublisherConfig{URL: url, Logger: quietLogger(), Recorder: &rec,
		Retry: backoffFast()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	const n, workers = 4000, 16
	var confirmed sync.Map
	var sent atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				id := fmt.Sprintf("pub-%d", i)
				if err := p.Publish(ctx, idemq.Message{ID: id, RoutingKey: queue, Body: []byte(id)}); err != nil {
					errc <- err
					return
				}
				confirmed.Store(id, true)
				sent.Add(1)
			}
		}()
	}
	for cut := 1; cut <= 3; cut++ {
		target := int64(cut * n / 4)
		testenv.Eventually(t, 60*time.Second, "publishing progress", func() bool { return sent.Load() >= target })
		proxy.Cut()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatalf("publish failed: %v", err)
	}
	inQueue := map[string]int{}
	for _, d := range testenv.Drain(t, queue) {
		inQueue[d.MessageId]++
	}
	missing := 0
	confirmed.Range(func(k, _ any) bool {
		if inQueue[k.(string)] == 0 {
			missing++
		}
		return true
	})
	if missing > 0 {
		t.Fatalf("%d confirmed messages are not in the queue", missing)
	}
	if len(inQueue) != n {
		t.Fatalf("%d distinct IDs in the queue, want %d", len(inQueue), n)
	}
	if rec.Get(idemq.CountReconnects) < 3 {
		t.Fatalf("reconnects = %d, want ≥ 3", rec.Get(idemq.CountReconnects))
	}
	t.Logf("published %d, retries %d, reconnects %d, duplicates in queue %d",
		rec.Get(idemq.CountPublished), rec.Get(idemq.CountPublishRetries), rec.Get(idemq.CountReconnects), sumDup(inQueue))
}

func sumDup(m map[string]int) int {
	d := 0
	for _, v := range m {
		d += v - 1
	}
	return d
}

func TestPublishHonoursContext(t *testing.T) {
	// A broker that never answers: a listener that accepts and says nothing.
	p, err := idemq.NewPublisher(idemq.PublisherConfig{URL: "amqp://guest:guest@127.0.0.1:1/", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = p.Publish(ctx, idemq.Message{ID: "x", RoutingKey: "q"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want a deadline error", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("Publish took %v past its deadline", time.Since(start))
	}
}

// A basic.return belongs to exactly one publish. Two publishes with the
// same message ID are in flight on one channel: one to a durable queue
// (its confirm waits for the broker's fsync, slowed further by a stream of
// persistent messages), one unroutable (returned and confirmed at once).
// Matching the return by message ID pinned it on the routable publish and
// reported the unroutable one confirmed — a message silently lost (issue
// 24 item 1).
func TestPublishReturnMatchedToItsOwnPublish(t *testing.T) {
	testenv.RequireAMQP(t)
	queue := testenv.Queue(t, nil)
	nowhere := testenv.Name(t, "nowhere")
	var rec idemq.Counters
	p, err := idemq.NewPublisher(idemq.PublisherConfig{Logger: quietLogger(), Recorder: &rec, Dial: testenv.Dial})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Background load: persistent messages to the durable queue, so the
	// routable publishes' confirms lag behind the unroutable ones'.
	stop := make(chan struct{})
	var load sync.WaitGroup
	var loadErr atomic.Value
	body := make([]byte, 4096)
	for w := 0; w < 8; w++ {
		load.Add(1)
		go func() {
			defer load.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := p.Publish(ctx, idemq.Message{ID: fmt.Sprintf("load-%d-%d", w, i), RoutingKey: queue, Body: body}); err != nil {
					loadErr.Store(err)
					return
				}
			}
		}()
	}

	const rounds, pairs = 5, 40
	misrouted := 0
	for r := 0; r < rounds; r++ {
		routable := make([]error, pairs)
		unroutable := make([]error, pairs)
		var wg sync.WaitGroup
		for k := 0; k < pairs; k++ {
			id := fmt.Sprintf("dup-%d-%d", r, k)
			wg.Add(2)
			go func() {
				defer wg.Done()
				routable[k] = p.Publish(ctx, idemq.Message{ID: id, RoutingKey: queue, Body: []byte("routable")})
			}()
			go func() {
				defer wg.Done()
				unroutable[k] = p.Publish(ctx, idemq.Message{ID: id, RoutingKey: nowhere, Body: []byte("unroutable")})
			}()
		}
		wg.Wait()
		for k := 0; k < pairs; k++ {
			var re *idemq.ReturnedError
			okU := errors.As(unroutable[k], &re) && errors.Is(unroutable[k], idemq.ErrUnroutable) && re.RoutingKey == nowhere
			if routable[k] != nil || !okU {
				misrouted++
				if misrouted <= 3 {
					t.Errorf("pair dup-%d-%d: routable publish err = %v; unroutable publish err = %v (want nil and a ReturnedError for %q)",
						r, k, routable[k], unroutable[k], nowhere)
				}
			}
		}
	}
	close(stop)
	load.Wait()
	if err, _ := loadErr.Load().(error); err != nil {
		t.Fatalf("background publish: %v", err)
	}
	if misrouted > 0 {
		t.Fatalf("%d of %d pairs got the return pinned on the wrong publish", misrouted, rounds*pairs)
	}
	dups := 0
	for _, d := range testenv.Drain(t, queue) {
		if string(d.Body) == "routable" {
			dups++
		}
	}
	if dups != rounds*pairs {
		t.Fatalf("queue holds %d routable duplicates-by-ID, want %d", dups, rounds*pairs)
	}
	if n := rec.Get(idemq.CountReconnects); n != 0 {
		t.Fatalf("reconnects = %d, want 0", n)
	}
}

// NewPublisher refuses a configuration it cannot run with, at once: a
// broker URL that does not parse (without its password in the error), or
// a negative bound.
func TestNewPublisherValidates(t *testing.T) {
	tests := []struct {
		name   string
		cfg    idemq.PublisherConfig
		wantIs error
	}{
		{"invalid URL", idemq.PublisherConfig{URL: "amqp://guest:s3cret/x@[::1"}, idemq.ErrInvalidURL},
		{"invalid URL in the list", idemq.PublisherConfig{URLs: []string{"amqp://127.0.0.1:5672/", "http://x:s3cret@h"}}, idemq.ErrInvalidURL},
		{"negative MaxInFlight", idemq.PublisherConfig{MaxInFlight: -1}, nil},
		{"negative MaxAttempts", idemq.PublisherConfig{MaxAttempts: -1}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := idemq.NewPublisher(tt.cfg)
			if err == nil || p != nil {
				t.Fatalf("NewPublisher = %v, %v; want an error", p, err)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Fatalf("err = %v, want it to match %v", err, tt.wantIs)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("err = %v: it shows the password", err)
			}
		})
	}
	if _, err := idemq.NewPublisher(idemq.PublisherConfig{}); err != nil {
		t.Fatalf("the zero config: %v, want it usable", err)
	}
}
