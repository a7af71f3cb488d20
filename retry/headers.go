package retry

import (
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/headerval"
)

// Death is one entry of the broker's x-death header.
type Death struct {
	Queue       string    `json:"queue"`
	Reason      string    `json:"reason"` // rejected, expired, maxlen, delivery_limit
	Count       int64     `json:"count"`  // clamped to [0, MaxInt32]
	Exchange    string    `json:"exchange"`
	RoutingKeys []string  `json:"routing_keys,omitempty"`
	Time        time.Time `json:"time"` // zero when absent or malformed
}

// ParseXDeath reads an x-death header value defensively: it never panics,
// skips entries that are not tables, ignores fields of the wrong type and
// clamps counts. A nil or non-array value yields nil.
func ParseXDeath(v any) []Death {
	arr, ok := v.([]any)
	if !ok {
		return nil
	}
	out := make([]Death, 0, len(arr))
	for _, e := range arr {
		t, ok := asTable(e)
		if !ok {
			continue
		}
		d := Death{
			Queue:    str(t["queue"]),
			Reason:   str(t["reason"]),
			Exchange: str(t["exchange"]),
		}
		if n, ok := headerval.Count(t["count"]); ok {
			d.Count = n
		}
		if ts, ok := t["time"].(time.Time); ok {
			d.Time = ts
		}
		if rks, ok := t["routing-keys"].([]any); ok {
			for _, rk := range rks {
				if s, ok := strOK(rk); ok {
					d.RoutingKeys = append(d.RoutingKeys, s)
				}
			}
		}
		out = append(out, d)
	}
	return out
}

func asTable(v any) (map[string]any, bool) {
	switch t := v.(type) {
	case amqp.Table:
		return t, true
	case map[string]any:
		return t, true
	}
	return nil, false
}

func strOK(v any) (string, bool) {
	switch s := v.(type) {
	case string:
		return strings.ToValidUTF8(s, "\uFFFD"), true
	case []byte:
		return strings.ToValidUTF8(string(s), "\uFFFD"), true
	}
	return "", false
}

func str(v any) string { s, _ := strOK(v); return s }

// Attempt returns the attempt number a delivery carries in x-idemq-attempt:
// 1 when absent, malformed or below 1 (the policy always rewrites it, so a
// bad value can reset the count at most once — never loop forever).
func Attempt(h amqp.Table) int {
	n, ok := headerval.Count(h[idemq.HeaderAttempt])
	if !ok || n < 1 {
		return 1
	}
	return int(n)
}

// DeliveryCount returns the quorum queue's x-delivery-count (ok=false when
// absent or malformed).
func DeliveryCount(h amqp.Table) (int64, bool) {
	return headerval.Count(h[idemq.HeaderDeliveryCount])
}

// FromRetryPath reports whether d came back to its work queue through
// idemq's own retry path, so its x-idemq-* headers were written by the
// policy: it arrived through the default exchange with its own queue as
// routing key (as a retry queue dead-letters it, or as the policy
// republishes it), and carries the marker the policy writes on every such
// hop — x-idemq-queue equal to the queue it is consumed from, with
// x-idemq-attempt or x-idemq-requeues. A message published to a business
// exchange never qualifies, whatever headers its producer set. A producer
// allowed to publish straight to the work queue through the default
// exchange can still imitate the marker: deny it write access to the
// default exchange where that matters.
func FromRetryPath(d *idemq.Delivery) bool {
	if d == nil || d.Exchange != "" || d.RoutingKey == "" || d.RoutingKey != d.Queue {
		return false
	}
	if q, ok := strOK(d.Headers[idemq.HeaderQueue]); !ok || q != d.Queue {
		return false
	}
	_, attempt := d.Headers[idemq.HeaderAttempt]
	_, requeues := d.Headers[idemq.HeaderRequeues]
	return attempt || requeues
}

// StripIdemqHeaders returns a copy of h without any x-idemq-* header.
func StripIdemqHeaders(h amqp.Table) amqp.Table {
	out := make(amqp.Table, len(h))
	for k, v := range h {
		if !strings.HasPrefix(k, idemq.HeaderPrefix) {
			out[k] = v
		}
	}
	return out
}

// stripForged drops the inbound x-idemq-* headers of a delivery that did
// not come through idemq's own retry path (a producer can set any header:
// a forged x-idemq-original-exchange would steer a replay, a forged
// x-idemq-attempt would use up attempts). The original route is then
// taken from the delivery itself. d.Headers is replaced, not modified.
func stripForged(d *idemq.Delivery) {
	if FromRetryPath(d) {
		return
	}
	for k := range d.Headers {
		if strings.HasPrefix(k, idemq.HeaderPrefix) {
			d.Headers = StripIdemqHeaders(d.Headers)
			return
		}
	}
}

// countHeaders are the policy's integer headers; every other x-idemq-*
// header the policy writes is a string.
var countHeaders = map[string]bool{idemq.HeaderAttempt: true, idemq.HeaderAttempts: true, idemq.HeaderRequeues: true}

// bound caps every x-idemq-* header of h (about to be republished) in
// place: strings at maxHeaderText bytes (the error text at errLimit, the
// original message ID at maxOriginalIDText), counts as int64, anything
// else dropped. What idemq adds to a message stays a few KiB at most.
func bound(h amqp.Table, errLimit int) {
	for k, v := range h {
		if !strings.HasPrefix(k, idemq.HeaderPrefix) {
			continue
		}
		if countHeaders[k] {
			if n, ok := headerval.Count(v); ok {
				h[k] = n
			} else {
				delete(h, k)
			}
			continue
		}
		s, ok := strOK(v)
		if !ok {
			delete(h, k)
			continue
		}
		limit := maxHeaderText
		switch k {
		case idemq.HeaderError:
			limit = errLimit
		case idemq.HeaderOriginalMessageID:
			limit = maxOriginalIDText
		}
		h[k] = headerval.Truncate(s, limit)
	}
}

// minimalHeaders are the headers of a dead letter that did not fit with
// idemq's usual ones: the message's own headers, the reason and the
// attempt count.
func minimalHeaders(own amqp.Table, reason string, attempts int) amqp.Table {
	h := StripIdemqHeaders(own)
	delete(h, idemq.HeaderDeliveryCount)
	h[idemq.HeaderReason] = headerval.Truncate(reason, maxHeaderText)
	h[idemq.HeaderAttempts] = int64(attempts)
	return h
}
