package frame_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/frame"
)

// wireCapture is an amqp091-go channel talking to a scripted peer over an
// in-memory pipe: the peer does just enough of the AMQP handshake to open a
// connection and a channel, then reports the payload size of every content
// header frame the client writes. It lets the size computation be checked
// against amqp091-go's real encoder, without a broker (the broker-facing
// check is TestPublishHeadersNearFrameMax).
type wireCapture struct {
	ch      *amqp.Channel
	headers chan int
}

func newWireCapture(tb testing.TB) *wireCapture {
	tb.Helper()
	client, server := net.Pipe()
	w := &wireCapture{headers: make(chan int, 1)}
	ready := make(chan error, 1)
	go w.serve(server, ready)
	conn, err := amqp.Open(client, amqp.Config{
		SASL:   []amqp.Authentication{&amqp.PlainAuth{Username: "u", Password: "p"}},
		Locale: "en_US",
	})
	if err != nil {
		tb.Fatalf("open: %v", err)
	}
	tb.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	ch, err := conn.Channel()
	if err != nil {
		tb.Fatalf("channel: %v", err)
	}
	if err := <-ready; err != nil {
		tb.Fatal(err)
	}
	w.ch = ch
	return w
}

// size publishes pub and returns the payload size of the content header
// frame amqp091-go wrote, or the error it returned.
func (w *wireCapture) size(pub amqp.Publishing) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.ch.PublishWithContext(ctx, "", "q", false, false, pub); err != nil {
		return 0, err
	}
	select {
	case n := <-w.headers:
		return n, nil
	case <-ctx.Done():
		return 0, errors.New("no content header frame seen")
	}
}

func writeTestFrame(w io.Writer, typ byte, channel uint16, payload []byte) error {
	var b bytes.Buffer
	b.WriteByte(typ)
	_ = binary.Write(&b, binary.BigEndian, channel)
	_ = binary.Write(&b, binary.BigEndian, uint32(len(payload)))
	b.Write(payload)
	b.WriteByte(0xCE)
	_, err := w.Write(b.Bytes())
	return err
}

func method(class, id uint16, args ...[]byte) []byte {
	var b bytes.Buffer
	_ = binary.Write(&b, binary.BigEndian, class)
	_ = binary.Write(&b, binary.BigEndian, id)
	for _, a := range args {
		b.Write(a)
	}
	return b.Bytes()
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
func longstr(s string) []byte {
	return append(be32(uint32(len(s))), s...)
}

func (w *wireCapture) serve(c net.Conn, ready chan<- error) {
	fail := func(err error) { ready <- err; _ = c.Close() }
	proto := make([]byte, 8)
	if _, err := io.ReadFull(c, proto); err != nil {
		fail(err)
		return
	}
	// connection.start: version 0-9, no server properties, PLAIN, en_US.
	if err := writeTestFrame(c, 1, 0, method(10, 10, []byte{0, 9}, be32(0), longstr("PLAIN"), longstr("en_US"))); err != nil {
		fail(err)
		return
	}
	var hdr [7]byte
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return // the test is over
		}
		payload := make([]byte, binary.BigEndian.Uint32(hdr[3:7])+1) // + frame end
		if _, err := io.ReadFull(c, payload); err != nil {
			return
		}
		payload = payload[:len(payload)-1]
		channel := binary.BigEndian.Uint16(hdr[1:3])
		var err error
		switch hdr[0] {
		case 2: // content header
			w.headers <- len(payload)
			continue
		case 1:
		default:
			continue
		}
		switch binary.BigEndian.Uint32(payload[:4]) {
		case 10<<16 | 11: // start-ok → tune: channel-max, frame-max, no heartbeat
			err = writeTestFrame(c, 1, 0, method(10, 30, be16(2047), be32(131072), be16(0)))
		case 10<<16 | 40: // open → open-ok
			err = writeTestFrame(c, 1, 0, method(10, 41, []byte{0}))
		case 20<<16 | 10: // channel.open → open-ok
			err = writeTestFrame(c, 1, channel, method(20, 11, be32(0)))
			ready <- err
		}
		if err != nil {
			fail(err)
			return
		}
	}
}

func TestContentHeaderPayloadSizeMatchesAMQP091(t *testing.T) {
	w := newWireCapture(t)
	long := strings.Repeat("s", 255)
	ts := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	cases := []struct {
		name    string
		pub     amqp.Publishing
		wantErr bool // both amqp091-go and the computation refuse it
	}{
		{name: "no properties", pub: amqp.Publishing{}},
		{name: "body only", pub: amqp.Publishing{Body: []byte("hello")}},
		{name: "every property", pub: amqp.Publishing{
			ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: 2, Priority: 9,
			CorrelationId: "corr", ReplyTo: "reply", Expiration: "60000", MessageId: "order-1",
			Timestamp: ts, Type: "created", UserId: "guest", AppId: "app", Body: []byte("x"),
		}},
		{name: "255-byte short strings", pub: amqp.Publishing{
			ContentType: long, ContentEncoding: long, CorrelationId: long, ReplyTo: long,
			Expiration: long, MessageId: long, Type: long, UserId: long, AppId: long,
		}},
		{name: "empty headers table", pub: amqp.Publishing{Headers: amqp.Table{}, MessageId: "m"}},
		{name: "scalar header types", pub: amqp.Publishing{Headers: amqp.Table{
			"nil": nil, "bool": true, "false": false, "byte": byte(7), "int8": int8(-7), "int16": int16(-300),
			"uint16": uint16(65000), "int": 123456, "int32": int32(-5), "uint32": uint32(4e9),
			"int64": int64(math.MinInt64), "float32": float32(1.5), "float64": math.Pi,
			"decimal": amqp.Decimal{Scale: 2, Value: 12345}, "time": ts,
			"string": "héllo wörld", "empty": "", "bytes": []byte{0, 1, 2, 255}, "nobytes": []byte{},
		}}},
		{name: "nested", pub: amqp.Publishing{Headers: amqp.Table{
			"x-death": []any{
				amqp.Table{"count": int64(3), "reason": "expired", "queue": "q.retry.1s", "time": ts,
					"routing-keys": []any{"q", "r"}, "exchange": ""},
				amqp.Table{},
			},
			"array":       []any{nil, int8(1), "two", []any{[]any{}}, amqp.Table{"k": []byte("v")}},
			"empty-array": []any{},
			"table":       amqp.Table{"inner": amqp.Table{"deeper": amqp.Table{"x": 1.0}}},
		}}},
		{name: "255-byte key", pub: amqp.Publishing{Headers: amqp.Table{long: "v"}}},
		{name: "idemq failure headers", pub: amqp.Publishing{MessageId: "transfer-42", Headers: amqp.Table{
			"x-idemq-attempt": int64(3), "x-idemq-error": strings.Repeat("e", 1024), "x-idemq-error-class": "handler-error",
			"x-idemq-first-failure": "2024-05-06T07:08:09.123Z", "x-idemq-last-failure": "2024-05-06T07:08:10.456Z",
			"x-idemq-original-exchange": "", "x-idemq-original-routing-key": "transfers", "x-idemq-group": "bank",
			"x-idemq-queue": "transfers", idemq.HeaderPublishSeq: int64(99),
		}}},
		{name: "large string header", pub: amqp.Publishing{Headers: amqp.Table{"big": strings.Repeat("b", 200_000)}}},
		{name: "256-byte property", pub: amqp.Publishing{CorrelationId: long + "s"}, wantErr: true},
		{name: "256-byte key", pub: amqp.Publishing{Headers: amqp.Table{long + "k": 1}}, wantErr: true},
		{name: "256-byte nested key", pub: amqp.Publishing{Headers: amqp.Table{"t": amqp.Table{long + "k": 1}}}, wantErr: true},
		{name: "uint64", pub: amqp.Publishing{Headers: amqp.Table{"u": uint64(1)}}, wantErr: true},
		{name: "plain map", pub: amqp.Publishing{Headers: amqp.Table{"m": map[string]any{"k": "v"}}}, wantErr: true},
		{name: "struct in array", pub: amqp.Publishing{Headers: amqp.Table{"a": []any{1, struct{}{}}}}, wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, gotErr := frame.ContentHeaderPayloadSize(&tc.pub)
			if tc.wantErr {
				if gotErr == nil {
					t.Fatalf("computed %d bytes, want an error", got)
				}
				// amqp091-go refuses it too, but only after writing the
				// method frame (which breaks a real connection's stream):
				// a fresh capture per refused case.
				if _, err := newWireCapture(t).size(tc.pub); err == nil {
					t.Fatalf("amqp091-go encoded what the computation refuses (%v)", gotErr)
				}
				return
			}
			if gotErr != nil {
				t.Fatal(gotErr)
			}
			want, err := w.size(tc.pub)
			if err != nil {
				t.Fatalf("amqp091-go: %v", err)
			}
			if got != want {
				t.Fatalf("computed %d bytes, amqp091-go wrote %d", got, want)
			}
			// What idemq.HeaderPublishSeq adds when send sets it.
			bare, tagged := tc.pub, tc.pub
			bare.Headers, tagged.Headers = amqp.Table{}, amqp.Table{idemq.HeaderPublishSeq: int64(1 << 40)}
			for k, v := range tc.pub.Headers {
				if k != idemq.HeaderPublishSeq {
					bare.Headers[k], tagged.Headers[k] = v, v
				}
			}
			without, err1 := w.size(bare)
			with, err2 := w.size(tagged)
			if err1 != nil || err2 != nil {
				t.Fatalf("amqp091-go: %v, %v", err1, err2)
			}
			if d := frame.Int64HeaderSize(idemq.HeaderPublishSeq, len(bare.Headers)); with-without != d {
				t.Fatalf("%s adds %d bytes, Int64HeaderSize says %d", idemq.HeaderPublishSeq, with-without, d)
			}
		})
	}
}

// FuzzContentHeaderPayloadSize decodes random bytes into a header table
// and properties and checks the computed size against the frame amqp091-go
// writes.
func FuzzContentHeaderPayloadSize(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x00\x05hello\x07\x03abc"))
	f.Add([]byte("\x0d\x02\x01a\x0c\x01b\x0e\x02\x00\x01\x05\x00\x00\x00\x00\x00\x00\x00\x01"))
	f.Add([]byte("\x10\x03key\x0b\x04abcd\x0a\x02\x01\x02\x0f\x00\xff\x06"))
	f.Add(bytes.Repeat([]byte{0x0d, 0x03}, 40))
	w := newWireCapture(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		d := &fuzzDecoder{data: data}
		pub := amqp.Publishing{
			ContentType:  d.str(40),
			MessageId:    d.str(255),
			DeliveryMode: d.byte() % 3,
			Priority:     d.byte() % 10,
			AppId:        d.str(20),
			Headers:      d.table(0),
		}
		if d.byte()%2 == 1 {
			pub.Timestamp = time.Unix(int64(d.u32()), 0)
		}
		got, err := frame.ContentHeaderPayloadSize(&pub)
		if err != nil {
			t.Fatalf("computation refused an encodable message: %v", err)
		}
		want, err := w.size(pub)
		if err != nil {
			t.Fatalf("amqp091-go: %v", err)
		}
		if got != want {
			t.Fatalf("computed %d bytes, amqp091-go wrote %d for %#v", got, want, pub.Headers)
		}
	})
}

// fuzzDecoder turns fuzz bytes into encodable AMQP values; it reads zeros
// past the end of its input.
type fuzzDecoder struct {
	data []byte
	pos  int
}

func (d *fuzzDecoder) byte() byte {
	if d.pos >= len(d.data) {
		d.pos++
		return 0
	}
	b := d.data[d.pos]
	d.pos++
	return b
}

func (d *fuzzDecoder) more() bool { return d.pos < len(d.data) }

func (d *fuzzDecoder) u32() uint32 {
	return uint32(d.byte())<<24 | uint32(d.byte())<<16 | uint32(d.byte())<<8 | uint32(d.byte())
}

func (d *fuzzDecoder) str(maxLen int) string {
	n := int(d.byte()) % (maxLen + 1)
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteByte(d.byte())
	}
	return b.String()
}

func (d *fuzzDecoder) table(depth int) amqp.Table {
	t := amqp.Table{}
	n := int(d.byte() % 8)
	for i := 0; i < n && d.more(); i++ {
		t[d.str(255)] = d.value(depth)
	}
	return t
}

func (d *fuzzDecoder) value(depth int) any {
	kinds := byte(18)
	if depth >= 3 {
		kinds = 16 // no nesting past depth 3
	}
	switch d.byte() % kinds {
	case 0:
		return nil
	case 1:
		return d.byte()%2 == 1
	case 2:
		return d.byte()
	case 3:
		return int8(d.byte())
	case 4:
		return int16(d.u32())
	case 5:
		return uint16(d.u32())
	case 6:
		return int(int32(d.u32()))
	case 7:
		return int32(d.u32())
	case 8:
		return uint32(d.u32())
	case 9:
		return int64(d.u32())<<32 | int64(d.u32())
	case 10:
		return math.Float32frombits(d.u32())
	case 11:
		return math.Float64frombits(uint64(d.u32())<<32 | uint64(d.u32()))
	case 12:
		return amqp.Decimal{Scale: d.byte(), Value: int32(d.u32())}
	case 13:
		return d.str(1000)
	case 14:
		return []byte(d.str(1000))
	case 15:
		return time.Unix(int64(d.u32()), 0)
	case 16:
		n := int(d.byte() % 5)
		a := make([]any, 0, n)
		for i := 0; i < n; i++ {
			a = append(a, d.value(depth+1))
		}
		return a
	default:
		return d.table(depth + 1)
	}
}

// BenchmarkContentHeaderPayloadSize measures the per-publish cost of the
// size check on a dead letter's worth of idemq headers.
func BenchmarkContentHeaderPayloadSize(b *testing.B) {
	pub := amqp.Publishing{ContentType: "application/json", DeliveryMode: 2, MessageId: "transfer-42",
		Timestamp: time.Now(), Headers: amqp.Table{
			"x-idemq-attempts": int64(3), "x-idemq-error": strings.Repeat("e", 1024), "x-idemq-error-class": "handler-error",
			"x-idemq-first-failure": "2024-05-06T07:08:09.123Z", "x-idemq-last-failure": "2024-05-06T07:08:10.456Z",
			"x-idemq-original-exchange": "", "x-idemq-original-routing-key": "transfers", "x-idemq-group": "bank",
			"x-idemq-queue": "transfers", "x-idemq-reason": "max-attempts", "x-idemq-dead-lettered-at": "2024-05-06T07:08:10.456Z",
			"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", idemq.HeaderPublishSeq: int64(99),
		}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := frame.ContentHeaderPayloadSize(&pub); err != nil {
			b.Fatal(err)
		}
	}
}
