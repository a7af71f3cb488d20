package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/idemq/idemq/sqldb"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
)

// Message is one message to publish once its transaction commits.
type Message struct {
	// ID is the stable message ID — the business key. Required
	// ([idemq.ValidateID]); a resend after a relay crash keeps it.
	ID         string
	Exchange   string // "" is the default exchange
	RoutingKey string
	Body       []byte
	// ContentType defaults to the publisher's default when empty.
	ContentType string
	// Headers are stored as JSON: strings, booleans, numbers (integers come
	// back as int64, others as float64), nested tables and arrays survive;
	// other values (byte slices, times, decimals) are rejected by Add.
	Headers amqp.Table
	// OrderingKey is optional. With RelayConfig.Ordered, messages sharing a
	// key are published one at a time in id order.
	OrderingKey string
}

// Validate checks the message as Add does.
func (m *Message) Validate() error {
	if err := idemq.ValidateID(m.ID); err != nil {
		return err
	}
	if len(m.Exchange) > 255 || len(m.RoutingKey) > 255 || len(m.OrderingKey) > 255 || len(m.ContentType) > 255 {
		return fmt.Errorf("%w: exchange, routing key, ordering key and content type are at most 255 bytes", ErrInvalidMessage)
	}
	return nil
}

// Sentinel errors.
var (
	// ErrInvalidMessage: Add refused a message (bad ID, oversized field,
	// headers that do not encode as JSON).
	ErrInvalidMessage = errors.New("outbox: invalid message")
	// ErrNotFailed: an operator action on a row that does not exist or is
	// not failed.
	ErrNotFailed = errors.New("outbox: no such failed row")
)

// State of an outbox row.
type State string

// Row states.
const (
	StatePending State = "pending"
	StateSent    State = "sent"
	StateFailed  State = "failed"
)

// Row is a claimed outbox row.
type Row struct {
	ID         int64 // the table's id (insert order)
	Message    Message
	Attempts   int    // claims so far, including this one
	HeadersErr error  // set when the stored headers did not decode
	Owner      string // the relay that claimed it
}

// Stats describes the pending backlog.
type Stats struct {
	Pending int64         // rows pending (claimed or not)
	Lag     time.Duration // age of the oldest pending row; 0 when none
}

// Store is an outbox table; [SQLStore] implements it for every SQL
// dialect, the relay drives it. All methods are safe for concurrent use.
type Store interface {
	// Add inserts msgs into the outbox inside tx (your transaction:
	// sqldb.StdTx(tx) or postgres.PgxTx(tx)). Nothing is visible to a
	// relay until tx commits; a rollback removes them.
	Add(ctx context.Context, tx sqldb.Querier, msgs ...Message) error
	// Claim leases up to limit claimable rows to owner for lease, in id
	// order, incrementing their attempts.
	Claim(ctx context.Context, owner string, limit int, lease time.Duration, ordered bool) ([]Row, error)
	// MarkSent marks rows sent (their confirms arrived).
	MarkSent(ctx context.Context, ids []int64) error
	// Retry releases a row owned by owner, claimable again after delay.
	Retry(ctx context.Context, owner string, id int64, delay time.Duration, lastErr string) error
	// Fail marks a pending row owned by owner failed with the reason.
	Fail(ctx context.Context, owner string, id int64, reason string) error
	// Purge deletes up to limit rows sent more than olderThan ago.
	Purge(ctx context.Context, olderThan time.Duration, limit int) (int64, error)
	// Stats reports the pending backlog.
	Stats(ctx context.Context) (Stats, error)
	// Count returns how many rows are in each state (for tests and tools).
	Count(ctx context.Context) (map[State]int64, error)
	// Table is the table name.
	Table() string
}

// FailedRows is what an operator does about failed rows; the SQL stores
// implement it. With [RelayConfig.Ordered], a failed row holds back the
// later rows of its ordering key until it is retried or skipped.
type FailedRows interface {
	// Blocked lists the failed rows that hold back pending rows of their
	// ordering key, in id order.
	Blocked(ctx context.Context) ([]BlockedRow, error)
	// RetryFailed makes failed row id pending again with its attempts
	// reset: the relay publishes it, then the rows it held back.
	// [ErrNotFailed] when the row does not exist or is not failed.
	RetryFailed(ctx context.Context, id int64) error
	// SkipFailed releases the ordering key of failed row id: the row stays
	// failed and unpublished (its last_error records the skip and the
	// key), and the later rows of the key are published without it.
	// [ErrNotFailed] when the row does not exist or is not failed.
	SkipFailed(ctx context.Context, id int64) error
}

// BlockedRow is a failed row holding back rows of its ordering key.
type BlockedRow struct {
	FailedID    int64  // the failed row's id
	MessageID   string // its message ID
	OrderingKey string
	LastError   string
	Waiting     int64 // pending rows of the key after it
}

// Waker is implemented by stores that can signal new committed rows (the
// PostgreSQL store, with LISTEN/NOTIFY). Listen blocks until ctx is done,
// calling wake (which never blocks) for each notification and once after
// every (re)connect; it reconnects by itself on errors.
type Waker interface {
	Listen(ctx context.Context, wake func()) error
}

// EncodeHeaders turns headers into the JSON stored in the table ("" for none).
func EncodeHeaders(h amqp.Table) (string, error) {
	if len(h) == 0 {
		return "", nil
	}
	if err := checkJSONable(map[string]any(h), 0); err != nil {
		return "", fmt.Errorf("%w: headers: %v", ErrInvalidMessage, err)
	}
	b, err := json.Marshal(map[string]any(h))
	if err != nil {
		return "", fmt.Errorf("%w: headers: %v", ErrInvalidMessage, err)
	}
	return string(b), nil
}

func checkJSONable(v any, depth int) error {
	if depth > 32 {
		return errors.New("nested too deep")
	}
	switch x := v.(type) {
	case nil, string, bool, int, int8, int16, int32, int64, uint8, uint16, uint32, float32, float64:
		return nil
	case amqp.Table:
		return checkJSONable(map[string]any(x), depth+1)
	case map[string]any:
		for k, e := range x {
			if err := checkJSONable(e, depth+1); err != nil {
				return fmt.Errorf("%q: %w", k, err)
			}
		}
		return nil
	case []any:
		for i, e := range x {
			if err := checkJSONable(e, depth+1); err != nil {
				return fmt.Errorf("[%d]: %w", i, err)
			}
		}
		return nil
	}
	return fmt.Errorf("unsupported header value type %T", v)
}

// DecodeHeaders parses stored header JSON back into an AMQP table.
func DecodeHeaders(s string) (amqp.Table, error) {
	if s == "" || s == "null" {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("outbox: headers: %w", err)
	}
	if dec.More() {
		return nil, errors.New("outbox: headers: trailing data")
	}
	return normalizeTables(fromJSON(m)).(amqp.Table), nil
}

func fromJSON(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		f, _ := x.Float64()
		return f
	case map[string]any:
		for k, e := range x {
			x[k] = fromJSON(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = fromJSON(e)
		}
		return x
	}
	return v
}

// normalizeTables converts nested map[string]any into amqp.Table, which is
// what the AMQP encoder wants for field tables.
func normalizeTables(v any) any {
	switch x := v.(type) {
	case map[string]any:
		t := amqp.Table{}
		for k, e := range x {
			t[k] = normalizeTables(e)
		}
		return t
	case amqp.Table:
		for k, e := range x {
			x[k] = normalizeTables(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = normalizeTables(e)
		}
		return x
	}
	return v
}
