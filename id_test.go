package idemq_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
)

func reasonOf(err error) string {
	var r *idemq.RejectError
	if errors.As(err, &r) {
		return r.Reason
	}
	return ""
}

func TestMessageIDSources(t *testing.T) {
	sum := sha256.Sum256([]byte("body"))
	hash := "sha256:" + hex.EncodeToString(sum[:])
	cases := []struct {
		name   string
		cfg    idemq.IDConfig
		d      idemq.Delivery
		want   string
		reason string // when an error is expected
	}{
		{"message_id", idemq.IDConfig{}, idemq.Delivery{MessageID: "m1"}, "m1", ""},
		{"nothing", idemq.IDConfig{}, idemq.Delivery{Body: []byte("body")}, "", idemq.ReasonMissingID},
		{"extractor first", idemq.IDConfig{Extractor: idemq.FromHeader("order")},
			idemq.Delivery{MessageID: "m1", Headers: amqp.Table{"order": "o-7"}}, "o-7", ""},
		{"extractor absent falls through to message_id", idemq.IDConfig{Extractor: idemq.FromHeader("order")},
			idemq.Delivery{MessageID: "m1"}, "m1", ""},
		{"integer header", idemq.IDConfig{Extractor: idemq.FromHeader("n")},
			idemq.Delivery{Headers: amqp.Table{"n": int64(42)}}, "42", ""},
		{"bytes header", idemq.IDConfig{Extractor: idemq.FromHeader("n")},
			idemq.Delivery{Headers: amqp.Table{"n": []byte("b")}}, "b", ""},
		{"table header is invalid", idemq.IDConfig{Extractor: idemq.FromHeader("n")},
			idemq.Delivery{MessageID: "m1", Headers: amqp.Table{"n": amqp.Table{}}}, "", idemq.ReasonInvalidID},
		{"fallback header after message_id", idemq.IDConfig{FallbackHeader: "x-id"},
			idemq.Delivery{Headers: amqp.Table{"x-id": "h1"}}, "h1", ""},
		{"message_id wins over fallback", idemq.IDConfig{FallbackHeader: "x-id"},
			idemq.Delivery{MessageID: "m1", Headers: amqp.Table{"x-id": "h1"}}, "m1", ""},
		{"json field", idemq.IDConfig{Extractor: idemq.FromJSONField("order.id")},
			idemq.Delivery{Body: []byte(`{"order":{"id":"A-1"}}`)}, "A-1", ""},
		{"json number keeps its text", idemq.IDConfig{Extractor: idemq.FromJSONField("id")},
			idemq.Delivery{Body: []byte(`{"id":12345678901234567890}`)}, "12345678901234567890", ""},
		{"json field absent falls through", idemq.IDConfig{Extractor: idemq.FromJSONField("id")},
			idemq.Delivery{MessageID: "m1", Body: []byte(`{"other":1}`)}, "m1", ""},
		{"json null falls through", idemq.IDConfig{Extractor: idemq.FromJSONField("id")},
			idemq.Delivery{MessageID: "m1", Body: []byte(`{"id":null}`)}, "m1", ""},
		{"json not an object", idemq.IDConfig{Extractor: idemq.FromJSONField("id")},
			idemq.Delivery{MessageID: "m1", Body: []byte(`[1]`)}, "", idemq.ReasonInvalidID},
		{"json garbage", idemq.IDConfig{Extractor: idemq.FromJSONField("id")},
			idemq.Delivery{MessageID: "m1", Body: []byte(`{"id":`)}, "", idemq.ReasonInvalidID},
		{"json trailing data", idemq.IDConfig{Extractor: idemq.FromJSONField("id")},
			idemq.Delivery{Body: []byte(`{"id":"a"} {"id":"b"}`)}, "", idemq.ReasonInvalidID},
		{"json bool", idemq.IDConfig{Extractor: idemq.FromJSONField("id")},
			idemq.Delivery{Body: []byte(`{"id":true}`)}, "", idemq.ReasonInvalidID},
		{"json empty string is absent", idemq.IDConfig{Extractor: idemq.FromJSONField("id")},
			idemq.Delivery{Body: []byte(`{"id":""}`)}, "", idemq.ReasonMissingID},
		{"content hash only when chosen", idemq.IDConfig{ContentHash: true},
			idemq.Delivery{Body: []byte("body")}, hash, ""},
		{"content hash is the last resort", idemq.IDConfig{ContentHash: true},
			idemq.Delivery{MessageID: "m1", Body: []byte("body")}, "m1", ""},
		{"too long", idemq.IDConfig{}, idemq.Delivery{MessageID: strings.Repeat("x", 256)}, "", idemq.ReasonInvalidID},
		{"control character", idemq.IDConfig{}, idemq.Delivery{MessageID: "a\nb"}, "", idemq.ReasonInvalidID},
		{"invalid utf-8", idemq.IDConfig{}, idemq.Delivery{MessageID: "a\xffb"}, "", idemq.ReasonInvalidID},
		{"invalid extractor ID is not skipped", idemq.IDConfig{Extractor: idemq.FromHeader("order")},
			idemq.Delivery{MessageID: "m1", Headers: amqp.Table{"order": "bad\x00"}}, "", idemq.ReasonInvalidID},
		{"custom extractor error", idemq.IDConfig{Extractor: func(*idemq.Delivery) (string, error) {
			return "", idemq.ErrMissingMessageID
		}}, idemq.Delivery{MessageID: "m1"}, "", idemq.ReasonMissingID},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.cfg.MessageID(&c.d)
			if c.reason != "" {
				if reasonOf(err) != c.reason {
					t.Fatalf("MessageID = %q, %v; want a rejection with reason %s", got, err, c.reason)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("MessageID = %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

// FuzzMessageID: whatever arrives on the wire, the answer is either a valid
// ID or a rejection with reason missing-id or invalid-id — never a panic,
// never an invalid ID let through — and the same delivery always gets the
// same answer (resends must map to the same key).
func FuzzMessageID(f *testing.F) {
	f.Add("m1", "h1", []byte(`{"order":{"id":"A-1"}}`), true)
	f.Add("", "", []byte(`{"order":{"id":7}}`), false)
	f.Add("", "bad\x00", []byte(`{"order":`), true)
	f.Add("a\xff", "", []byte(`{"order":{"id":["x"]}}`), false)
	f.Add("", "", []byte(`{"order":{"id":"`+strings.Repeat("z", 300)+`"}}`), false)
	f.Add("", "", []byte{}, true)
	f.Fuzz(func(t *testing.T, msgID, header string, body []byte, hash bool) {
		cfg := idemq.IDConfig{Extractor: idemq.FromJSONField("order.id"), FallbackHeader: "x-id", ContentHash: hash}
		d := &idemq.Delivery{MessageID: msgID, Body: body, Headers: amqp.Table{"x-id": header}}
		id, err := cfg.MessageID(d)
		id2, err2 := cfg.MessageID(d)
		if id != id2 || (err == nil) != (err2 == nil) {
			t.Fatalf("not deterministic: %q %v / %q %v", id, err, id2, err2)
		}
		if err != nil {
			if r := reasonOf(err); r != idemq.ReasonMissingID && r != idemq.ReasonInvalidID {
				t.Fatalf("error %v has reason %q", err, r)
			}
			if id != "" {
				t.Fatalf("an ID %q with an error", id)
			}
			return
		}
		if verr := idemq.ValidateID(id); verr != nil {
			t.Fatalf("invalid ID %q let through: %v", id, verr)
		}
	})
}

// FuzzFromJSONField never panics and returns only what the body holds.
func FuzzFromJSONField(f *testing.F) {
	f.Add([]byte(`{"a":{"b":"x"}}`), "a.b")
	f.Add([]byte(`{"a":1.5e3}`), "a")
	f.Add([]byte(`{"a":{"b":null}}`), "a.b.c")
	f.Add([]byte(`"str"`), "a")
	f.Add([]byte("\xff{"), "")
	f.Fuzz(func(t *testing.T, body []byte, path string) {
		id, err := idemq.FromJSONField(path)(&idemq.Delivery{Body: body})
		if err != nil && id != "" {
			t.Fatalf("ID %q with error %v", id, err)
		}
		if err != nil && !errors.Is(err, idemq.ErrInvalidMessageID) {
			t.Fatalf("error %v does not wrap ErrInvalidMessageID", err)
		}
	})
}
