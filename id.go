package idemq

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Extractor returns the message ID of a delivery from a business key (a
// header, a body field). It returns "" and a nil error when the delivery
// does not carry that key, so the next source is tried; an error means the
// key is there but unusable (the delivery is rejected with reason
// invalid-id, or missing-id when the error wraps ErrMissingMessageID).
type Extractor func(d *Delivery) (string, error)

// IDConfig says where the consumer finds a delivery's message ID. The ID is
// decided once per delivery, by the consumer, before any middleware runs
// ([ConsumerConfig].ID); the dedup guard, the inbox, the Bloom tier, the
// retry policy and dead-lettering all read that one value through
// [Delivery.ID]. The sources
// are tried in this order, the first that yields a non-empty ID wins:
//
//  1. Extractor (a business key: [FromHeader], [FromJSONField] or your own);
//  2. the AMQP message_id property;
//  3. FallbackHeader;
//  4. a SHA-256 of the body, only when ContentHash is set.
//
// The ID found is validated with [ValidateID]. No ID at all rejects
// the delivery with reason missing-id, an invalid one with invalid-id: it
// is never processed unguarded. The zero value uses the message_id only.
type IDConfig struct {
	Extractor      Extractor
	FallbackHeader string
	// ContentHash makes "sha256:<hex of the body>" the last resort. Two
	// different messages with the same body are then the same message:
	// choose it only when that is what you mean.
	ContentHash bool
}

// MessageID returns the validated message ID of d, or a [*RejectError]
// (reason [ReasonMissingID] or [ReasonInvalidID]). It reads the delivery's
// properties only; the consumer calls it once per delivery (see [Apply]).
func (c IDConfig) MessageID(d *Delivery) (string, error) {
	id, source, err := c.find(d)
	if err != nil {
		reason := ReasonInvalidID
		if errors.Is(err, ErrMissingMessageID) {
			reason = ReasonMissingID
		}
		return "", Reject(reason, fmt.Errorf("message ID from %s: %w", source, err))
	}
	if id == "" {
		return "", Reject(ReasonMissingID, ErrMissingMessageID)
	}
	if err := ValidateID(id); err != nil {
		return "", Reject(ReasonInvalidID, fmt.Errorf("message ID from %s: %w", source, err))
	}
	return id, nil
}

// Apply decides d's message ID with c and stores it in d, so that
// [Delivery.ID] returns it to every layer. The consumer calls it for each
// delivery; call it yourself when you build a Delivery by hand and want a
// rule other than the AMQP message_id.
func (c IDConfig) Apply(d *Delivery) {
	d.id, d.idErr = c.MessageID(d)
	d.idSet = true
}

// find returns the first non-empty ID and the name of its source.
func (c IDConfig) find(d *Delivery) (id, source string, err error) {
	if c.Extractor != nil {
		id, err := c.Extractor(d)
		if err != nil || id != "" {
			return id, "extractor", err
		}
	}
	if d.MessageID != "" {
		return d.MessageID, "message_id", nil
	}
	if c.FallbackHeader != "" {
		id, err := headerID(d, c.FallbackHeader)
		if err != nil || id != "" {
			return id, "header " + c.FallbackHeader, err
		}
	}
	if c.ContentHash {
		sum := sha256.Sum256(d.Body)
		return "sha256:" + hex.EncodeToString(sum[:]), "content hash", nil
	}
	return "", "no source", nil
}

// FromHeader extracts the ID from a header. String and []byte values are
// taken as they are, integers in decimal; any other type is an error.
func FromHeader(name string) Extractor {
	return func(d *Delivery) (string, error) { return headerID(d, name) }
}

func headerID(d *Delivery, name string) (string, error) {
	switch v := d.Header(name).(type) {
	case nil:
		return "", nil
	case string:
		return v, nil
	case []byte:
		return string(v), nil
	case int8:
		return strconv.FormatInt(int64(v), 10), nil
	case int16:
		return strconv.FormatInt(int64(v), 10), nil
	case int32:
		return strconv.FormatInt(int64(v), 10), nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	case int:
		return strconv.Itoa(v), nil
	case uint8:
		return strconv.FormatUint(uint64(v), 10), nil
	case uint16:
		return strconv.FormatUint(uint64(v), 10), nil
	case uint32:
		return strconv.FormatUint(uint64(v), 10), nil
	case uint64:
		return strconv.FormatUint(v, 10), nil
	default:
		return "", fmt.Errorf("%w: header %q is a %T, want a string or an integer", ErrInvalidMessageID, name, v)
	}
}

// FromJSONField extracts the ID from a field of a JSON object body; path is
// dot-separated ("order.id"). A string value is taken as it is, a number in
// its exact JSON text. An absent field (or null) yields "" so the next
// source is tried; a body that is not a JSON object, or a field that is an
// object, array or boolean, is an error (the delivery is rejected, never
// passed through with a made-up ID).
func FromJSONField(path string) Extractor {
	parts := strings.Split(path, ".")
	return func(d *Delivery) (string, error) {
		dec := json.NewDecoder(bytes.NewReader(d.Body))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return "", fmt.Errorf("%w: body is not JSON: %v", ErrInvalidMessageID, err)
		}
		if rest := bytes.TrimSpace(d.Body[dec.InputOffset():]); len(rest) > 0 {
			return "", fmt.Errorf("%w: body has data after its JSON value", ErrInvalidMessageID)
		}
		for i, p := range parts {
			obj, ok := v.(map[string]any)
			if !ok {
				what := "the body"
				if i > 0 {
					what = fmt.Sprintf("JSON field %q", strings.Join(parts[:i], "."))
				}
				return "", fmt.Errorf("%w: %s is not a JSON object", ErrInvalidMessageID, what)
			}
			if v, ok = obj[p]; !ok {
				return "", nil
			}
		}
		switch x := v.(type) {
		case nil:
			return "", nil
		case string:
			return x, nil
		case json.Number:
			return x.String(), nil
		default:
			return "", fmt.Errorf("%w: JSON field %q is a %T, want a string or a number", ErrInvalidMessageID, path, x)
		}
	}
}
