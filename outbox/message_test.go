package outbox

import (
	"errors"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestHeadersRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		in   amqp.Table
		want amqp.Table
	}{
		{"empty", nil, nil},
		{"scalars", amqp.Table{"s": "x", "b": true, "i": int64(7), "f": 1.25, "n": nil},
			amqp.Table{"s": "x", "b": true, "i": int64(7), "f": 1.25, "n": nil}},
		{"small ints widen", amqp.Table{"i": int32(3), "u": uint8(4)}, amqp.Table{"i": int64(3), "u": int64(4)}},
		{"nested", amqp.Table{"t": amqp.Table{"a": []any{"x", int64(1), amqp.Table{"z": false}}}},
			amqp.Table{"t": amqp.Table{"a": []any{"x", int64(1), amqp.Table{"z": false}}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := EncodeHeaders(c.in)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeHeaders(s)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("round trip %#v -> %q -> %#v, want %#v", c.in, s, got, c.want)
			}
		})
	}
}

func TestEncodeHeadersRejects(t *testing.T) {
	for name, h := range map[string]amqp.Table{
		"time":   {"t": time.Now()},
		"bytes":  {"b": []byte("x")},
		"nested": {"t": amqp.Table{"d": amqp.Decimal{}}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := EncodeHeaders(h); !errors.Is(err, ErrInvalidMessage) {
				t.Fatalf("EncodeHeaders = %v, want ErrInvalidMessage", err)
			}
		})
	}
}

// FuzzDecodeHeaders: stored headers are read back from the database; any
// text must decode to a table the AMQP encoder accepts, or to an error.
func FuzzDecodeHeaders(f *testing.F) {
	for _, s := range []string{"", "null", "{}", `{"a":1}`, `{"a":{"b":[1,2.5,"x",null,true]}}`,
		`{"a":1}{`, `[1]`, `{"big":123456789012345678901234567890}`, `"x"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := DecodeHeaders(s)
		if err != nil {
			return
		}
		if err := h.Validate(); err != nil {
			t.Fatalf("DecodeHeaders(%q) = %#v, not a valid AMQP table: %v", s, h, err)
		}
		if _, err := EncodeHeaders(h); err != nil {
			t.Fatalf("re-encode %#v: %v", h, err)
		}
	})
}
