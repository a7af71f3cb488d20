// Package headerval reads AMQP header values defensively: whatever type a
// producer or the broker put in a header, a reader gets a value or ok=false,
// never a panic or an overflow.
package headerval

import (
	"math"
	"strconv"
	"strings"
)

// Int64 reads an integer header value of any AMQP integer type, or a
// decimal string ([]byte too, spaces trimmed). ok is false for anything
// else, and for a uint64 beyond math.MaxInt64.
func Int64(v any) (int64, bool) {
	switch x := v.(type) {
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
	case string:
		return parse(x)
	case []byte:
		return parse(string(x))
	}
	return 0, false
}

func parse(s string) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	return n, err == nil
}
