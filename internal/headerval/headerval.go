package headerval

import (
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// TimeFormat is the format of idemq's time-valued headers
// (x-idemq-first-failure, x-idemq-last-failure, x-idemq-dead-lettered-at,
// ...).
const TimeFormat = time.RFC3339Nano

// maxCount bounds every count read from a header, so a forged header cannot
// overflow arithmetic.
const maxCount = math.MaxInt32

// Int64 reads an integer header value: an [Integer], or a decimal string
// ([]byte too, spaces trimmed). ok is false for anything else.
func Int64(v any) (int64, bool) {
	switch x := v.(type) {
	case string:
		return parse(x)
	case []byte:
		return parse(string(x))
	}
	return Integer(v)
}

// Integer reads a table value of any Go integer type (the AMQP ones, int
// and uint); ok is false for anything else, strings included, and beyond
// math.MaxInt64.
func Integer(v any) (int64, bool) {
	switch x := v.(type) {
	case uint:
		if uint64(x) > math.MaxInt64 {
			return 0, false
		}
		return int64(x), true
	case int:
		return int64(x), true
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		if x > math.MaxInt64 {
			return 0, false
		}
		return int64(x), true
	}
	return 0, false
}

func parse(s string) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	return n, err == nil
}

// Count reads a count from a header value of any AMQP numeric type, or a
// decimal string, clamped to [0, MaxInt32]. ok is false for anything else
// (a float with a fraction, NaN and the infinities included).
func Count(v any) (int64, bool) {
	switch x := v.(type) {
	case uint64:
		if x > maxCount {
			return maxCount, true
		}
	case float32:
		return floatCount(float64(x))
	case float64:
		return floatCount(x)
	}
	n, ok := Int64(v)
	if !ok {
		return 0, false
	}
	if n < 0 {
		n = 0
	}
	if n > maxCount {
		n = maxCount
	}
	return n, true
}

func floatCount(f float64) (int64, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) || f != math.Trunc(f) {
		return 0, false
	}
	if f < 0 {
		return 0, true
	}
	if f > maxCount {
		return maxCount, true
	}
	return int64(f), true
}

// Truncate bounds s to at most limit bytes without splitting a UTF-8
// sequence, replacing invalid bytes. limit <= 0 means no bound.
func Truncate(s string, limit int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if limit <= 0 || len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
