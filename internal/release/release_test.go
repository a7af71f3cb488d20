package release_test

import (
	"math"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/release"
)

const due = "x-idemq-due"

func TestDue(t *testing.T) {
	received := time.UnixMilli(1_800_000_000_000)
	delay := 5 * time.Second
	latest := received.Add(delay)
	for _, tt := range []struct {
		name string
		v    any
		want time.Time
	}{
		{"missing: the queue's delay from receipt", nil, latest},
		{"on time", received.Add(2 * time.Second).UnixMilli(), received.Add(2 * time.Second)},
		{"overdue (a restart)", received.Add(-time.Hour).UnixMilli(), received.Add(-time.Hour)},
		{"later than the delay: capped", received.Add(time.Hour).UnixMilli(), latest},
		{"int32", int32(5), time.UnixMilli(5)},
		{"decimal string", "1800000001000", received.Add(time.Second)},
		{"garbage string", "soon", latest},
		{"negative", int64(-1), latest},
		{"float", 1.8e12, latest},
		{"huge uint64", uint64(math.MaxUint64), latest},
		{"max int64", int64(math.MaxInt64), latest},
		{"table", amqp.Table{"a": 1}, latest},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := amqp.Table{}
			if tt.v != nil {
				h[due] = tt.v
			}
			if got := release.Due(h, due, delay, received); !got.Equal(tt.want) {
				t.Errorf("Due(%v) = %v, want %v", tt.v, got, tt.want)
			}
		})
	}
}

// FuzzDue: whatever the header holds, a delivery is never held past its
// queue's delay from receipt, and Due never panics.
func FuzzDue(f *testing.F) {
	for _, s := range []string{"", "0", "1800000000000", "-5", "9223372036854775807", "x"} {
		f.Add(s, int64(0), uint8(0))
	}
	f.Add("", int64(1_800_000_000_000), uint8(1))
	f.Add("", int64(math.MinInt64), uint8(1))
	f.Add("", int64(math.MaxInt64), uint8(2))
	f.Fuzz(func(t *testing.T, s string, n int64, kind uint8) {
		var v any
		switch kind % 4 {
		case 0:
			v = s
		case 1:
			v = n
		case 2:
			v = uint64(n)
		case 3:
			v = int32(n)
		}
		received := time.UnixMilli(1_800_000_000_000)
		got := release.Due(amqp.Table{due: v}, due, time.Second, received)
		if got.After(received.Add(time.Second)) {
			t.Fatalf("Due(%T %v) = %v: later than the delay allows", v, v, got)
		}
	})
}
