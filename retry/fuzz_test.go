package retry

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/headerval"
)

func attemptSeeds(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 3, 7, 4, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 10, 2, 1, 'q', 13, 2, 3, 'a', 'b', 'c'})
	f.Add([]byte("\x01\x05\x07\x04\x01\x00\x00\x00\x00\x00\x00\x00\x08\x04\x01\x00\x00\x00\x00\x00\x00\x00\x0a\x02\x01q\x0b\x02\x0aamq.fanout\x00"))
	f.Add([]byte("\x01\x04\x07\x02\x05-9999\x0a\x03\x01q\x0d\x03\x06\xff\xfe\xfd\xfc\xfb\xfa\x0e\x06\x00\x00\x00\x00\x00\x00\xf0\x7f"))
}

// FuzzAttemptHeaders: whatever headers a delivery carries, the counts the
// policy reads are bounded (attempt in [1, MaxInt32], counts in [0,
// MaxInt32]), and what it republishes carries bounded, well-typed x-idemq-*
// headers: strings within their limits, counts as int64 in range — and a
// delivery that did not come through idemq's retry path carries none of
// its inbound x-idemq-* values.
func FuzzAttemptHeaders(f *testing.F) {
	attemptSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		g := &gen{b: data}
		h, _ := g.value().(amqp.Table)
		if h == nil {
			h = amqp.Table{}
		}
		if a := Attempt(h); a < 1 || a > math.MaxInt32 {
			t.Fatalf("attempt %d", a)
		}
		if n, ok := DeliveryCount(h); ok && (n < 0 || n > math.MaxInt32) {
			t.Fatalf("delivery count %d", n)
		}
		for _, v := range h {
			if n, ok := headerval.Count(v); ok && (n < 0 || n > math.MaxInt32) {
				t.Fatalf("headerval.Count(%#v) = %d", v, n)
			}
		}
		queue := "q"
		d := &idemq.Delivery{MessageID: "m-1", Queue: queue, Headers: h, Body: []byte("b")}
		if g.byte()%2 == 0 {
			d.RoutingKey = queue // maybe from the retry path
		} else {
			d.Exchange, d.RoutingKey = "shop", "order.created"
		}
		trusted := FromRetryPath(d)
		pub := &scripted{}
		failures := g.byte() % 3
		p, err := New(Config{Sender: pub, QuickAttempts: 1, Delays: []time.Duration{time.Second}, MaxAttempts: 3})
		if err != nil {
			t.Fatal(err)
		}
		var herr error
		switch failures {
		case 0:
			herr = errors.New(strings.Repeat("x", 5000))
		case 1:
			herr = idemq.Permanent(errors.New("bad"))
		default:
			herr = idemq.Requeue(time.Second, "test", errors.New("later"))
		}
		if dec, ok := p.Admit(d); ok {
			carry(p, d, p.Decide(d, idemq.Run{Err: herr, N: 1}))
		} else {
			carry(p, d, dec)
		}
		for _, m := range pub.got {
			for k, v := range m.Headers {
				if !strings.HasPrefix(k, idemq.HeaderPrefix) {
					continue
				}
				if !trusted {
					if orig, ok := h[k]; ok && k != idemq.HeaderQueue && k != idemq.HeaderReason && k != idemq.HeaderAttempts {
						if s, ok := orig.(string); ok && s == v && s != "" && s != d.Exchange && s != d.RoutingKey && s != queue {
							t.Fatalf("untrusted inbound %s = %q republished", k, s)
						}
					}
				}
				switch x := v.(type) {
				case string:
					limit := maxHeaderText
					if k == idemq.HeaderError {
						limit = p.cfg.ErrorTextLimit
					} else if k == idemq.HeaderOriginalMessageID {
						limit = maxOriginalIDText
					}
					if len(x) > limit || !utf8.ValidString(x) {
						t.Fatalf("header %s: %d bytes", k, len(x))
					}
				case int64:
					if k == idemq.HeaderDue {
						// Unix milliseconds: now plus a configured delay.
						if due := time.UnixMilli(x); due.Before(p.cfg.Now()) || due.After(p.cfg.Now().Add(24*time.Hour)) {
							t.Fatalf("header %s = %v, want now plus a delay", k, due)
						}
						break
					}
					if x < 0 || x > math.MaxInt32+1 {
						t.Fatalf("header %s = %d", k, x)
					}
				default:
					t.Fatalf("header %s has type %T", k, v)
				}
			}
		}
	})
}
