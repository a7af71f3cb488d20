package deadletter

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemq/idemq/internal/headerval"
)

// Masks of [NormalizeError].
const (
	MaskUUID   = "<uuid>"
	MaskHex    = "<hex>"
	MaskNumber = "<n>"
)

var (
	reUUID = regexp.MustCompile(`(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`)
	// A hex ID: 0x… or a run of 8+ hex digits with at least one digit (a
	// word such as "deadlines" or "facade" is not an ID).
	reHex    = regexp.MustCompile(`(?i)\b(?:0x[0-9a-f]+|[0-9a-f]{8,})\b`)
	reNumber = regexp.MustCompile(`[0-9]+(?:\.[0-9]+)?`)
)

// maxPattern bounds a normalised error text (runes).
const maxPattern = 300

// NormalizeError is error text with what varies between messages of one
// cause masked, so that the dead letters of one cause share it: UUIDs
// become <uuid>, hex IDs (0x…, or 8+ hex digits with a digit among them)
// <hex>, and every other number <n>. Runs of white space become one space;
// the result is cut to 300 runes.
func NormalizeError(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	s = reUUID.ReplaceAllString(s, MaskUUID)
	s = reHex.ReplaceAllStringFunc(s, func(m string) string {
		if strings.HasPrefix(m, "0x") || strings.HasPrefix(m, "0X") || strings.ContainsAny(m, "0123456789") {
			return MaskHex
		}
		return m
	})
	s = reNumber.ReplaceAllString(s, MaskNumber)
	if utf8.RuneCountInString(s) > maxPattern {
		r := []rune(s)
		s = string(r[:maxPattern-1]) + "…"
	}
	return s
}

// GroupKey is the group of a dead letter: its reason and its normalised
// error text, as a short stable hex ID (fit for a URL).
func GroupKey(e *Entry) string {
	sum := sha256.Sum256([]byte(e.Reason + "\x00" + NormalizeError(e.Error)))
	return hex.EncodeToString(sum[:6])
}

// InGroup selects the dead letters of group key.
func InGroup(key string) Filter {
	return func(e *Entry) bool { return GroupKey(e) == key }
}

// WithMessageID selects the dead letters whose message ID is id.
func WithMessageID(id string) Filter {
	return func(e *Entry) bool { return e.MessageID == id }
}

// Group is the dead letters of one cause: one reason, one normalised error
// text.
type Group struct {
	Key    string `json:"key"`
	Reason string `json:"reason"`
	// Pattern is the normalised error text ([NormalizeError]).
	Pattern string `json:"pattern"`
	// Example is the error text of the group's first dead letter.
	Example string `json:"example,omitempty"`
	// Count is the distinct dead letters of the group (duplicates of one
	// message ID counted once); Duplicates the further copies collapsed.
	Count      int `json:"count"`
	Duplicates int `json:"duplicates,omitempty"`
	// FirstFailure and LastFailure span the group's failures
	// (time.RFC3339Nano, as in the headers; "" when none said).
	FirstFailure string `json:"first_failure,omitempty"`
	LastFailure  string `json:"last_failure,omitempty"`
	// MessageIDs are the first few message IDs of the group.
	MessageIDs []string `json:"message_ids"`
}

// maxGroupIDs bounds Group.MessageIDs.
const maxGroupIDs = 5

// before: header time a is before b (text order when either does not parse).
func before(a, b string) bool {
	ta, errA := time.Parse(headerval.TimeFormat, a)
	tb, errB := time.Parse(headerval.TimeFormat, b)
	if errA != nil || errB != nil {
		return a < b
	}
	return ta.Before(tb)
}

// GroupEntries groups entries (as [Conn.List] returns them: one per dead
// letter) by cause, the largest group first (then by reason and pattern).
func GroupEntries(entries []*Entry) []Group {
	byKey := map[string]*Group{}
	var order []string
	for _, e := range entries {
		k := GroupKey(e)
		g, ok := byKey[k]
		if !ok {
			g = &Group{Key: k, Reason: e.Reason, Pattern: NormalizeError(e.Error), Example: e.Error, MessageIDs: []string{}}
			byKey[k] = g
			order = append(order, k)
		}
		g.Count++
		g.Duplicates += e.Duplicates
		if e.MessageID != "" && len(g.MessageIDs) < maxGroupIDs {
			g.MessageIDs = append(g.MessageIDs, e.MessageID)
		}
		if f := e.FirstFailure; f != "" && (g.FirstFailure == "" || before(f, g.FirstFailure)) {
			g.FirstFailure = f
		}
		if l := e.LastFailure; l != "" && (g.LastFailure == "" || before(g.LastFailure, l)) {
			g.LastFailure = l
		}
	}
	out := make([]Group, 0, len(order))
	for _, k := range order {
		out = append(out, *byKey[k])
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		if a.Reason != b.Reason {
			return a.Reason < b.Reason
		}
		return a.Pattern < b.Pattern
	})
	return out
}
