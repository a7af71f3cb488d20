package idemq_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
)

// frameRecorder is a net.Conn that parses the AMQP frames the client
// writes and records the total size of every content header frame, so a
// test sees what amqp091-go really put on the wire.
type frameRecorder struct {
	net.Conn

	mu      sync.Mutex
	buf     []byte
	skipped bool  // the 8-byte protocol header
	headers []int // total sizes (7-byte frame header + payload + frame end)
}

func (r *frameRecorder) Write(b []byte) (int, error) {
	r.mu.Lock()
	r.buf = append(r.buf, b...)
	if !r.skipped && len(r.buf) >= 8 {
		r.buf, r.skipped = r.buf[8:], true
	}
	for r.skipped && len(r.buf) >= 7 {
		size := int(binary.BigEndian.Uint32(r.buf[3:7]))
		if len(r.buf) < 7+size+1 {
			break
		}
		if r.buf[0] == 2 { // content header
			r.headers = append(r.headers, 7+size+1)
		}
		r.buf = r.buf[7+size+1:]
	}
	r.mu.Unlock()
	return r.Conn.Write(b)
}

func (r *frameRecorder) last() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.headers) == 0 {
		return 0
	}
	return r.headers[len(r.headers)-1]
}

// recordingDial makes a PublisherConfig.Dial that counts dials, records the
// negotiated frame_max and the content header frames written.
type recordingDial struct {
	dials    atomic.Int32
	frameMax atomic.Int64
	mu       sync.Mutex
	rec      *frameRecorder
}

func (d *recordingDial) dial(url string, cfg amqp.Config) (*amqp.Connection, error) {
	d.dials.Add(1)
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, 10*time.Second)
		if err != nil {
			return nil, err
		}
		r := &frameRecorder{Conn: c}
		d.mu.Lock()
		d.rec = r
		d.mu.Unlock()
		return r, nil
	}
	conn, err := testenv.Dial(url, cfg) // the fake (under IDEMQ_TEST_BROKER=fake) ignores cfg.Dial: no frames recorded
	if err == nil {
		d.frameMax.Store(int64(conn.Config.FrameSize))
	}
	return conn, err
}

func (d *recordingDial) lastHeaderFrame() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rec.last()
}

// A republish adds about 1.3 KB of idemq headers; near frame_max the
// content header frame outgrew it. amqp091-go does not check, the broker
// closed the connection (every publish in flight failed) and the publisher
// resent the same frame for ever (issue 24 item 12). Now a message whose
// content header frame exceeds the negotiated frame_max fails at once with
// a permanent ErrMessageTooLarge, nothing is sent and the connection stays
// up; one that fits exactly is published.
func TestPublishHeadersNearFrameMax(t *testing.T) {
	testenv.RequireRealBroker(t, "records the client's frames on its TCP socket (amqp.Config.Dial), which the fake's in-process pipe bypasses")
	testenv.RequireAMQP(t)
	queue := testenv.Queue(t, nil)
	var rec idemq.Counters
	dial := &recordingDial{}
	p, err := idemq.NewPublisher(idemq.PublisherConfig{Logger: quietLogger(), Recorder: &rec, Dial: dial.dial,
		Retry: backoffFast()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	publish := func(id string, pad int, timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return p.Publish(ctx, idemq.Message{ID: id, RoutingKey: queue, Body: []byte(id),
			Headers: amqp.Table{"x-idemq-error": strings.Repeat("e", pad)}})
	}
	// Probe: the size amqp091-go writes for a small pad. A pad n bytes
	// longer makes the frame n bytes longer (a long string); every ID has
	// the probe's length.
	const probePad = 16
	if err := publish("probe-00", probePad, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	base, frameMax := dial.lastHeaderFrame(), int(dial.frameMax.Load())
	t.Logf("probe header frame %d bytes", base)
	if base == 0 || frameMax < 4096 {
		t.Fatalf("probe: header frame %d bytes, frame_max %d", base, frameMax)
	}
	padFor := func(frame int) int { return probePad + frame - base }

	cases := []struct {
		name    string
		frame   int // total content header frame size
		tooBig  bool
		timeout time.Duration
	}{
		// Past the broker's own tolerance: before the fix the broker closed
		// the connection and the publish looped until its deadline.
		{"well over", frameMax + 1000, true, 5 * time.Second},
		{"one byte over", frameMax + 1, true, 5 * time.Second},
		{"exactly frame_max", frameMax, false, 20 * time.Second},
		{"one byte under", frameMax - 1, false, 20 * time.Second},
	}
	var published []string
	for i, tc := range cases {
		id := fmt.Sprintf("case-%03d", i)
		start := time.Now()
		err := publish(id, padFor(tc.frame), tc.timeout)
		took := time.Since(start)
		if tc.tooBig {
			if !errors.Is(err, idemq.ErrMessageTooLarge) || !idemq.IsPermanent(err) {
				t.Fatalf("%s (frame %d, frame_max %d): err = %v after %v, want a permanent ErrMessageTooLarge",
					tc.name, tc.frame, frameMax, err, took)
			}
			if took > 2*time.Second {
				t.Fatalf("%s: took %v, want an answer without retries", tc.name, took)
			}
		} else {
			if err != nil {
				t.Fatalf("%s (frame %d, frame_max %d): %v", tc.name, tc.frame, frameMax, err)
			}
			if got := dial.lastHeaderFrame(); got != tc.frame {
				t.Fatalf("%s: amqp091-go wrote a %d-byte header frame, the test meant %d", tc.name, got, tc.frame)
			}
			published = append(published, id)
		}
		// The connection is unharmed: a normal publish goes through on it.
		after := fmt.Sprintf("next-%03d", i)
		if err := publish(after, 0, 20*time.Second); err != nil {
			t.Fatalf("after %s: %v", tc.name, err)
		}
		published = append(published, after)
		if n, d := rec.Get(idemq.CountReconnects), dial.dials.Load(); n != 0 || d != 1 {
			t.Fatalf("after case %d (%s): reconnects = %d, dials = %d; want 0 and 1", i, tc.name, n, d)
		}
	}
	// Two publishes of one ID in flight at once, the frame exactly
	// frame_max: the second has no room for HeaderPublishSeq (which tells
	// their returns apart), so it waits for the first's confirm instead
	// of sending a frame the broker refuses.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	twin := idemq.Message{ID: "twin-000", RoutingKey: queue, Body: []byte("twin"),
		Headers: amqp.Table{"x-idemq-error": strings.Repeat("e", padFor(frameMax))}}
	for i, err := range p.PublishBatch(ctx, []idemq.Message{twin, twin}) {
		if err != nil {
			t.Fatalf("twin %d: %v", i, err)
		}
	}
	if n, d := rec.Get(idemq.CountReconnects), dial.dials.Load(); n != 0 || d != 1 {
		t.Fatalf("after the twins: reconnects = %d, dials = %d; want 0 and 1", n, d)
	}
	got := map[string]int{}
	for _, d := range testenv.Drain(t, queue) {
		got[d.MessageId]++
	}
	for _, id := range published {
		if got[id] != 1 {
			t.Errorf("%s is in the queue %d times, want once", id, got[id])
		}
	}
	if got["twin-000"] != 2 {
		t.Errorf("twin-000 is in the queue %d times, want twice", got["twin-000"])
	}
	if len(got) != len(published)+2 { // + the probe and the twins
		t.Fatalf("queue holds %d IDs, want %d: %v", len(got), len(published)+2, got)
	}
}

// A property or header key longer than an AMQP short string (255 bytes)
// cannot be encoded. amqp091-go notices only after it has buffered the
// publish method frame, so the next frame on the connection broke the
// broker's framing, the connection closed and the publish looped. It is
// refused before anything is sent; the connection stays up.
func TestPublishShortStringOverflowFailsAtOnce(t *testing.T) {
	testenv.RequireAMQP(t)
	queue := testenv.Queue(t, nil)
	var rec idemq.Counters
	dial := &recordingDial{}
	p, err := idemq.NewPublisher(idemq.PublisherConfig{Logger: quietLogger(), Recorder: &rec, Dial: dial.dial,
		Retry: backoffFast()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	long := strings.Repeat("k", 256)
	cases := []struct {
		name string
		msg  idemq.Message
	}{
		{"header key", idemq.Message{ID: "key", RoutingKey: queue, Headers: amqp.Table{long: "v"}}},
		{"nested header key", idemq.Message{ID: "nested", RoutingKey: queue, Headers: amqp.Table{"t": amqp.Table{long: 1}}}},
		{"correlation id", idemq.Message{ID: "corr", RoutingKey: queue, CorrelationID: long}},
		{"type", idemq.Message{ID: "type", RoutingKey: queue, Type: long}},
	}
	for i, tc := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		err := p.Publish(ctx, tc.msg)
		cancel()
		if !errors.Is(err, idemq.ErrInvalidHeaders) || time.Since(start) > 2*time.Second {
			t.Fatalf("%s: err = %v after %v, want ErrInvalidHeaders at once", tc.name, err, time.Since(start))
		}
		ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
		err = p.Publish(ctx, idemq.Message{ID: fmt.Sprintf("next-%d", i), RoutingKey: queue})
		cancel()
		if err != nil {
			t.Fatalf("after %s: %v", tc.name, err)
		}
		if n, d := rec.Get(idemq.CountReconnects), dial.dials.Load(); n != 0 || d != 1 {
			t.Fatalf("after %s: reconnects = %d, dials = %d; want 0 and 1", tc.name, n, d)
		}
	}
	if got := len(testenv.Drain(t, queue)); got != len(cases) {
		t.Fatalf("queue holds %d messages, want %d", got, len(cases))
	}
}
