package display

import (
	"testing"
	"time"
)

func TestOneLine(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"a\n  b\tc ", 10, "a b c"}, {"abcdef", 6, "abcdef"}, {"abcdefg", 6, "abcde…"}, {"ééééé", 4, "ééé…"}, {"", 3, ""},
	} {
		if got := OneLine(c.in, c.max); got != c.want {
			t.Errorf("OneLine(%q, %d) = %q, want %q", c.in, c.max, got, c.want)
		}
	}
}

func TestOrDash(t *testing.T) {
	if OrDash("") != "-" || OrDash("x") != "x" {
		t.Fatal(OrDash(""), OrDash("x"))
	}
}

func TestShortTime(t *testing.T) {
	if got := ShortTime("2026-01-02T03:04:05.123456789+02:00", time.RFC3339); got != "2026-01-02T01:04:05Z" {
		t.Errorf("RFC3339: %q", got)
	}
	if got := ShortTime("2026-01-02T03:04:05.5Z", "2006-01-02 15:04:05Z"); got != "2026-01-02 03:04:05Z" {
		t.Errorf("console layout: %q", got)
	}
	if got := ShortTime("yesterday", time.RFC3339); got != "yesterday" {
		t.Errorf("unparseable: %q", got)
	}
}
