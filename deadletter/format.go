package deadletter

import (
	"fmt"
	"sort"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// FormatHeader renders an AMQP header value for people: times in RFC 3339
// (UTC), byte strings quoted, arrays and tables recursively with table keys
// sorted. quote says whether plain strings are quoted too (a terminal
// wants it, to show spaces and empty strings; an HTML page does not).
func FormatHeader(v any, quote bool) string {
	switch x := v.(type) {
	case string:
		if quote {
			return fmt.Sprintf("%q", x)
		}
		return x
	case []byte:
		return fmt.Sprintf("%q", x)
	case time.Time:
		return x.UTC().Format(time.RFC3339)
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = FormatHeader(e, quote)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case amqp.Table:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + "=" + FormatHeader(x[k], quote)
		}
		return "{" + strings.Join(parts, " ") + "}"
	}
	return fmt.Sprint(v)
}
