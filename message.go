package idemq

import (
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
)

// MaxIDLength is the longest message ID accepted, in bytes (an AMQP short
// string).
const MaxIDLength = 255

// ValidateID checks a message ID: non-empty, at most [MaxIDLength] bytes,
// valid UTF-8, no control characters. The error wraps [ErrMissingMessageID]
// or [ErrInvalidMessageID].
func ValidateID(id string) error {
	if id == "" {
		return ErrMissingMessageID
	}
	if len(id) > MaxIDLength {
		return fmt.Errorf("%w: %d bytes, at most %d allowed", ErrInvalidMessageID, len(id), MaxIDLength)
	}
	if !utf8.ValidString(id) {
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidMessageID)
	}
	for i, r := range id {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: control character %U at byte %d", ErrInvalidMessageID, r, i)
		}
	}
	return nil
}

// NewMessageID returns a random, time-ordered ID (UUIDv7). Use it only for
// messages that have no business key: a random ID per attempt defeats
// deduplication, so the publisher never makes one up by itself.
func NewMessageID() string {
	return uuid.Must(uuid.NewV7()).String()
}

// Message is what a [Publisher] sends.
type Message struct {
	// ID is the stable message ID — the business key (an order number, a
	// transfer ID). Required; resends of the same message keep it.
	ID         string
	Exchange   string // "" is the default exchange
	RoutingKey string
	Body       []byte
	// ContentType defaults to "application/octet-stream".
	ContentType     string
	ContentEncoding string
	Headers         amqp.Table
	CorrelationID   string
	ReplyTo         string
	Type            string
	AppID           string
	Priority        uint8
	// Expiration is the per-message TTL in milliseconds, as AMQP wants it.
	Expiration string
	// Timestamp defaults to the time of the first publish attempt.
	Timestamp time.Time
	// Transient sends the message non-persistent. The default is persistent.
	Transient bool
}

func (m *Message) publishing(now time.Time) amqp.Publishing {
	mode := amqp.Persistent
	if m.Transient {
		mode = amqp.Transient
	}
	ct := m.ContentType
	if ct == "" {
		ct = "application/octet-stream"
	}
	ts := m.Timestamp
	if ts.IsZero() {
		ts = now
	}
	return amqp.Publishing{
		Headers:         m.Headers,
		ContentType:     ct,
		ContentEncoding: m.ContentEncoding,
		DeliveryMode:    mode,
		Priority:        m.Priority,
		CorrelationId:   m.CorrelationID,
		ReplyTo:         m.ReplyTo,
		Expiration:      m.Expiration,
		MessageId:       m.ID,
		Timestamp:       ts,
		Type:            m.Type,
		AppId:           m.AppID,
		Body:            m.Body,
	}
}

// Delivery is one message as a handler sees it. The consumer owns its
// acknowledgement: the handler's returned error decides it.
type Delivery struct {
	// MessageID is the AMQP message_id property as it arrived. The ID
	// every layer keys on is [Delivery.ID]: the consumer decides it once
	// from its [IDConfig] (a business key, this property, a header, or a
	// content hash).
	MessageID       string
	Body            []byte
	Headers         amqp.Table
	ContentType     string
	ContentEncoding string
	CorrelationID   string
	ReplyTo         string
	Type            string
	AppID           string
	UserID          string
	Expiration      string
	Priority        uint8
	DeliveryMode    uint8
	Timestamp       time.Time

	Exchange    string // the exchange it was published to
	RoutingKey  string
	Queue       string // the queue it was consumed from
	Group       string // the consumer group (namespaces dedup keys)
	Redelivered bool
	ConsumerTag string
	DeliveryTag uint64 // tag on the consumer's current channel (diagnostics only)
	ReceivedAt  time.Time
	// QueueDeliveryLimit is the delivery limit the broker applies to
	// Queue (a quorum queue drops or dead-letters a delivery whose
	// x-delivery-count passes it), as the consumer read it from the
	// management API (ConsumerConfig.ManagementURL) at its last read
	// (each (re)connect and every ManagementRefresh): the x-delivery-limit argument or a policy's or
	// operator policy's delivery-limit, the smallest. 0: not known (no
	// ManagementURL, no limit, not a quorum queue). retry.Policy keeps
	// in-place requeues below it.
	QueueDeliveryLimit int

	id    string // the ID decided by IDConfig.Apply
	idErr error
	idSet bool
}

// ID returns the delivery's message ID as the consumer decided it (see
// [IDConfig]), or a [*RejectError] with reason [ReasonMissingID] or
// [ReasonInvalidID] when it has none or an invalid one. A Delivery the
// consumer did not build (a test's, say) uses its AMQP MessageID unless
// [IDConfig.Apply] was called on it.
func (d *Delivery) ID() (string, error) {
	if !d.idSet {
		return IDConfig{}.MessageID(d)
	}
	return d.id, d.idErr
}

// LogID returns the delivery's ID for log lines: the decided ID when there
// is a valid one, else the raw AMQP message_id.
func (d *Delivery) LogID() string {
	if id, err := d.ID(); err == nil {
		return id
	}
	return d.MessageID
}

func newDelivery(d *amqp.Delivery, queue, group string, now time.Time) *Delivery {
	return &Delivery{
		MessageID:       d.MessageId,
		Body:            d.Body,
		Headers:         d.Headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		CorrelationID:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		Type:            d.Type,
		AppID:           d.AppId,
		UserID:          d.UserId,
		Expiration:      d.Expiration,
		Priority:        d.Priority,
		DeliveryMode:    d.DeliveryMode,
		Timestamp:       d.Timestamp,
		Exchange:        d.Exchange,
		RoutingKey:      d.RoutingKey,
		Queue:           queue,
		Group:           group,
		Redelivered:     d.Redelivered,
		ConsumerTag:     d.ConsumerTag,
		DeliveryTag:     d.DeliveryTag,
		ReceivedAt:      now,
	}
}

// Header returns the header value for key, or nil.
func (d *Delivery) Header(key string) any {
	if d.Headers == nil {
		return nil
	}
	return d.Headers[key]
}

// HeaderString returns a string-valued header ("" when absent or not a
// string; []byte values are converted).
func (d *Delivery) HeaderString(key string) string {
	switch v := d.Header(key).(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// Message returns the message that carries d on to exchange/routingKey
// with headers h: the ID the consumer decided for d (its raw message_id
// when it has no valid one), the body and every property a publish can
// set. The retry policy, the dead-letter paths and the Bloom router build
// their republishes with it.
func (d *Delivery) Message(exchange, routingKey string, h amqp.Table) Message {
	return Message{
		ID:              d.LogID(),
		Exchange:        exchange,
		RoutingKey:      routingKey,
		Body:            d.Body,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		Headers:         h,
		CorrelationID:   d.CorrelationID,
		ReplyTo:         d.ReplyTo,
		Type:            d.Type,
		AppID:           d.AppID,
		Priority:        d.Priority,
		Timestamp:       d.Timestamp,
		Transient:       d.DeliveryMode == amqp.Transient,
	}
}

// MessageOf is [Delivery.Message] for a raw delivery taken from the
// broker outside a consumer (a dead-letter queue, a delay queue): its
// message_id, body and properties, to exchange/routingKey with headers h.
func MessageOf(d *amqp.Delivery, exchange, routingKey string, h amqp.Table) Message {
	return Message{
		ID:              d.MessageId,
		Exchange:        exchange,
		RoutingKey:      routingKey,
		Body:            d.Body,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		Headers:         h,
		CorrelationID:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		Type:            d.Type,
		AppID:           d.AppId,
		Priority:        d.Priority,
		Timestamp:       d.Timestamp,
		Transient:       d.DeliveryMode == amqp.Transient,
	}
}
