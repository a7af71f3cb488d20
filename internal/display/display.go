package display

import (
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemq/idemq/internal/headerval"
)

// OneLine folds s's white space (newlines included) into single spaces
// and cuts it to at most max runes, the last one an ellipsis when cut.
func OneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) > max {
		r := []rune(s)
		s = string(r[:max-1]) + "…"
	}
	return s
}

// OrDash returns s, or "-" when s is empty.
func OrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ShortTime formats a header timestamp (headerval.TimeFormat) in UTC with
// layout; s itself when it does not parse.
func ShortTime(s, layout string) string {
	t, err := time.Parse(headerval.TimeFormat, s)
	if err != nil {
		return s
	}
	return t.UTC().Format(layout)
}
