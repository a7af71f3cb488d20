package retry

import (
	"encoding/binary"
	"math"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
)

func TestParseXDeath(t *testing.T) {
	ts := time.Unix(1700000000, 0)
	tests := []struct {
		name string
		in   any
		want []Death
	}{
		{"nil", nil, nil},
		{"not an array", "x-death", nil},
		{"empty", []any{}, []Death{}},
		{"broker shape", []any{amqp.Table{
			"count": int64(2), "reason": "expired", "queue": "q.retry.100", "time": ts,
			"exchange": "", "routing-keys": []any{"q.retry.100"},
		}}, []Death{{Queue: "q.retry.100", Reason: "expired", Count: 2, Time: ts, RoutingKeys: []string{"q.retry.100"}}}},
		{"garbage entries skipped", []any{42, "x", nil, amqp.Table{"count": "7", "reason": []byte("rejected")}},
			[]Death{{Reason: "rejected", Count: 7}}},
		{"negative and huge counts clamped", []any{
			amqp.Table{"count": int64(-5)}, amqp.Table{"count": uint64(math.MaxUint64)}, amqp.Table{"count": 1e300},
		}, []Death{{Count: 0}, {Count: math.MaxInt32}, {Count: math.MaxInt32}}},
		{"wrong field types ignored", []any{map[string]any{
			"count": []any{1}, "queue": 12, "time": "yesterday", "routing-keys": []any{1, "a", []byte("b")},
		}}, []Death{{RoutingKeys: []string{"a", "b"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParseXDeath(tt.in)
			if len(got) != len(tt.want) || (got == nil) != (tt.want == nil) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			for i := range got {
				g, w := got[i], tt.want[i]
				if g.Queue != w.Queue || g.Reason != w.Reason || g.Count != w.Count || g.Exchange != w.Exchange ||
					!g.Time.Equal(w.Time) || len(g.RoutingKeys) != len(w.RoutingKeys) {
					t.Fatalf("entry %d: got %+v, want %+v", i, g, w)
				}
				for j := range g.RoutingKeys {
					if g.RoutingKeys[j] != w.RoutingKeys[j] {
						t.Fatalf("entry %d: routing keys %v, want %v", i, g.RoutingKeys, w.RoutingKeys)
					}
				}
			}
		})
	}
}

func TestAttemptAndInt(t *testing.T) {
	tests := []struct {
		v    any
		want int
	}{
		{nil, 1}, {int64(3), 3}, {int32(2), 2}, {"4", 4}, {" 5 ", 5}, {"abc", 1}, {int64(-9), 1},
		{int64(0), 1}, {2.0, 2}, {2.5, 1}, {math.NaN(), 1}, {[]byte("6"), 6}, {amqp.Table{}, 1},
		{int64(math.MaxInt64), math.MaxInt32},
	}
	for _, tt := range tests {
		if got := Attempt(amqp.Table{idemq.HeaderAttempt: tt.v}); got != tt.want {
			t.Errorf("Attempt(%#v) = %d, want %d", tt.v, got, tt.want)
		}
	}
}

// gen builds an arbitrary header value from fuzz bytes: tables, arrays,
// strings, numbers of every AMQP type, timestamps, byte slices, nil.
type gen struct {
	b     []byte
	depth int
}

func (g *gen) byte() byte {
	if len(g.b) == 0 {
		return 0
	}
	c := g.b[0]
	g.b = g.b[1:]
	return c
}

func (g *gen) u64() uint64 {
	var buf [8]byte
	n := copy(buf[:], g.b)
	g.b = g.b[n:]
	return binary.LittleEndian.Uint64(buf[:])
}

func (g *gen) str() string {
	n := int(g.byte() % 16)
	if n > len(g.b) {
		n = len(g.b)
	}
	s := string(g.b[:n])
	g.b = g.b[n:]
	return s
}

var keys = []string{"count", "reason", "queue", "time", "exchange", "routing-keys", "original-expiration",
	idemq.HeaderAttempt, idemq.HeaderAttempts, idemq.HeaderRequeues, idemq.HeaderQueue, idemq.HeaderOriginalExchange, idemq.HeaderOriginalRoutingKey,
	idemq.HeaderFirstFailure, idemq.HeaderError, idemq.HeaderOriginalMessageID, idemq.HeaderDeliveryCount, idemq.HeaderDeath, "x-idemq-other", "custom"}

func (g *gen) value() any {
	if len(g.b) == 0 {
		return nil
	}
	g.depth++
	defer func() { g.depth-- }()
	switch k := g.byte() % 19; {
	case k == 0 && g.depth < 6:
		n := int(g.byte() % 5)
		arr := make([]any, n)
		for i := range arr {
			arr[i] = g.value()
		}
		return arr
	case k == 1 && g.depth < 6:
		t := amqp.Table{}
		for n := int(g.byte() % 6); n > 0; n-- {
			key := keys[int(g.byte())%len(keys)]
			if g.byte()%4 == 0 {
				key = g.str()
			}
			t[key] = g.value()
		}
		return t
	case k == 2:
		return g.str()
	case k == 3:
		return []byte(g.str())
	case k == 4:
		return int64(g.u64())
	case k == 5:
		return int32(g.u64())
	case k == 6:
		return uint64(g.u64())
	case k == 7:
		return math.Float64frombits(g.u64())
	case k == 8:
		return time.Unix(int64(g.u64()%(1<<40)), 0)
	case k == 9:
		return g.byte()%2 == 0
	case k == 10:
		return int8(g.byte())
	case k == 11:
		return float32(int32(g.u64()))
	case k == 12:
		return int(g.u64())
	case k == 13:
		return uint32(g.u64())
	case k == 14:
		return uint16(g.u64())
	case k == 15:
		return int16(g.u64())
	case k == 16:
		return amqp.Decimal{Scale: g.byte(), Value: int32(g.u64())}
	case k == 17:
		return math.Float32frombits(uint32(g.u64()))
	default:
		return nil
	}
}

func FuzzParseXDeath(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 2, 1, 3, 0, 4, 2, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0, 1, 1, 4, 0, 0, 4, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 0, 2, 5, 'q', 'u', 'e', 'u', 'e'})
	f.Add([]byte("\x00\x03\x01\x05\x05\x00\x06\x00\x02\x03abc\x02\x01\x07\x00\x02\x07expired"))
	f.Fuzz(func(t *testing.T, data []byte) {
		g := &gen{b: data}
		v := g.value()
		ds := ParseXDeath(v)
		for _, d := range ds {
			if d.Count < 0 || d.Count > math.MaxInt32 {
				t.Fatalf("count %d out of range", d.Count)
			}
			for _, s := range append([]string{d.Queue, d.Reason, d.Exchange}, d.RoutingKeys...) {
				if !utf8.ValidString(s) {
					t.Fatalf("invalid UTF-8 %q", s)
				}
			}
		}
		if arr, ok := v.([]any); ok && len(ds) > len(arr) {
			t.Fatalf("%d entries from an array of %d", len(ds), len(arr))
		}
		// The other header readers get the same garbage.
		h := amqp.Table{idemq.HeaderAttempt: v, idemq.HeaderDeliveryCount: v, idemq.HeaderDeath: v}
		if a := Attempt(h); a < 1 || a > math.MaxInt32 {
			t.Fatalf("attempt %d out of range", a)
		}
		if n, ok := DeliveryCount(h); ok && (n < 0 || n > math.MaxInt32) {
			t.Fatalf("delivery count %d out of range", n)
		}
	})
}
