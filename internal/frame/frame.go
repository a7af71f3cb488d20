// Package frame sizes AMQP 0-9-1 content header frames as amqp091-go
// encodes them, so that the publisher can refuse a message that would not
// fit the connection's frame_max, or that amqp091-go would fail to encode,
// before it writes anything (a failed encode after the method frame
// leaves the connection's stream broken).
package frame

import (
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Overhead is what a frame adds to its payload in AMQP 0-9-1: a 7-byte
// header (type, channel, payload size) and a frame-end octet. frame_max
// bounds the whole frame.
const Overhead = 7 + 1

// ContentHeaderPayloadSize returns the payload size in bytes of the content
// header frame amqp091-go writes for pub: class-id, weight, body size and
// property flags (14 bytes), then each property that is set. It follows
// amqp091-go's encoder (write.go: headerFrame.write, writeField,
// writeTable) field by field, so it fails exactly where that encoder would:
// a short string (a property, a table key) over 255 bytes, or a value of a
// type AMQP cannot carry. amqp091-go reports those only after it has
// written the publish method frame, which leaves the connection's stream
// broken; checking first keeps it healthy.
func ContentHeaderPayloadSize(pub *amqp.Publishing) (int, error) {
	n := 2 + 2 + 8 + 2
	short := func(name, s string) error {
		if s == "" {
			return nil
		}
		if len(s) > 255 {
			return fmt.Errorf("property %s is %d bytes; an AMQP short string holds at most 255", name, len(s))
		}
		n += 1 + len(s)
		return nil
	}
	// Order does not matter for the size, but follow the encoder's.
	if err := short("content-type", pub.ContentType); err != nil {
		return 0, err
	}
	if err := short("content-encoding", pub.ContentEncoding); err != nil {
		return 0, err
	}
	if len(pub.Headers) > 0 {
		t, err := tableSize(pub.Headers)
		if err != nil {
			return 0, fmt.Errorf("headers: %w", err)
		}
		n += t
	}
	if pub.DeliveryMode > 0 {
		n++
	}
	if pub.Priority > 0 {
		n++
	}
	for _, p := range []struct{ name, v string }{
		{"correlation-id", pub.CorrelationId},
		{"reply-to", pub.ReplyTo},
		{"expiration", pub.Expiration},
		{"message-id", pub.MessageId},
	} {
		if err := short(p.name, p.v); err != nil {
			return 0, err
		}
	}
	if !pub.Timestamp.IsZero() {
		n += 8
	}
	for _, p := range []struct{ name, v string }{
		{"type", pub.Type},
		{"user-id", pub.UserId},
		{"app-id", pub.AppId},
	} {
		if err := short(p.name, p.v); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// tableSize is the encoded size of an AMQP field table: a 4-byte length,
// then per entry a short-string key and a typed value.
func tableSize(t amqp.Table) (int, error) {
	n := 4
	for k, v := range t {
		if len(k) > 255 {
			return 0, fmt.Errorf("key %.40q… is %d bytes; an AMQP short string holds at most 255", k, len(k))
		}
		f, err := fieldSize(v)
		if err != nil {
			return 0, fmt.Errorf("key %q: %w", k, err)
		}
		n += 1 + len(k) + f
	}
	return n, nil
}

// fieldSize is the encoded size of one field value: a type octet and the
// value, for the Go types amqp091-go encodes (the same set as
// amqp.Table.Validate accepts).
func fieldSize(v any) (int, error) {
	switch v := v.(type) {
	case nil:
		return 1, nil
	case bool, byte, int8:
		return 2, nil
	case int16, uint16:
		return 3, nil
	case int, int32, uint32, float32:
		return 5, nil
	case amqp.Decimal:
		return 6, nil
	case int64, float64, time.Time:
		return 9, nil
	case string:
		return 5 + len(v), nil
	case []byte:
		return 5 + len(v), nil
	case []any:
		n := 5
		for i, e := range v {
			f, err := fieldSize(e)
			if err != nil {
				return 0, fmt.Errorf("array element %d: %w", i, err)
			}
			n += f
		}
		return n, nil
	case amqp.Table:
		t, err := tableSize(v)
		if err != nil {
			return 0, err
		}
		return 1 + t, nil
	}
	return 0, fmt.Errorf("value of type %T: %w", v, amqp.ErrFieldType)
}

// Int64HeaderSize is what a header key with an int64 value adds to a
// content header payload whose table holds others other headers: the
// entry, and the table's length word when the table would otherwise be
// empty (an empty table is not sent).
func Int64HeaderSize(key string, others int) int {
	size := 1 + len(key) + 9
	if others == 0 {
		size += 4
	}
	return size
}
