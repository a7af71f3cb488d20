package sqlstore

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func testDialect(p Placeholders) Dialect {
	return Dialect{Name: "test", Placeholders: p, Quote: func(s string) string { return "<" + s + ">" }, Now: "NOW()"}
}

func TestCompile(t *testing.T) {
	tests := []struct {
		name  string
		p     Placeholders
		tmpl  string
		query string
		args  []int
	}{
		{"question repeats", Question, "SELECT {key} FROM {table} WHERE a = @key AND b = @token AND c = @key",
			"SELECT <key> FROM <t> WHERE a = ? AND b = ? AND c = ?", []int{argKey, argToken, argKey}},
		{"dollar reuses numbers", Dollar, "x = @token, y = @key, z = @token, w = {now} + @lease",
			"x = $1, y = $2, z = $1, w = NOW() + $3", []int{argToken, argKey, argLease}},
		{"index and batch", Question, "DELETE FROM {table} USE {index} LIMIT @batch",
			"DELETE FROM <t> USE <t_expires_idx> LIMIT ?", []int{argBatch}},
		{"casts untouched", Dollar, "SELECT 1::bigint, $$x$$, @window",
			"SELECT 1::bigint, $$x$$, $1", []int{argWindow}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := testDialect(tt.p).compile(tt.tmpl, "t")
			if err != nil {
				t.Fatal(err)
			}
			if st.query != tt.query || !reflect.DeepEqual(st.args, tt.args) {
				t.Fatalf("compile = %q %v, want %q %v", st.query, st.args, tt.query, tt.args)
			}
		})
	}
	if _, err := testDialect(Question).compile("a = @nope", "t"); err == nil || !strings.Contains(err.Error(), "@nope") {
		t.Fatalf("unknown parameter: %v", err)
	}
	st, _ := testDialect(Question).compile("@key @lease @key", "t")
	got := st.bind(args("k", "tok", 7))
	if !reflect.DeepEqual(got, []any{"k", int64(7), "k"}) {
		t.Fatalf("bind = %v", got)
	}
}

func TestLockIsStablePerTable(t *testing.T) {
	d := testDialect(Question)
	a1, _ := d.compile("{lock}", "a")
	a2, _ := d.compile("{lock}", "a")
	b, _ := d.compile("{lock}", "b")
	if a1.query != a2.query || a1.query == b.query || strings.HasPrefix(a1.query, "-") {
		t.Fatalf("locks a=%s a=%s b=%s", a1.query, a2.query, b.query)
	}
}

func TestCheckTable(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"idemq_dedup", true}, {"_x9", true}, {"A", true}, {strings.Repeat("a", 51), true},
		{"", false}, {"9a", false}, {"a b", false}, {"a.b", false}, {"a;b", false}, {`a"`, false},
		{"a`", false}, {"é", false}, {strings.Repeat("a", 52), false},
	}
	for _, tt := range tests {
		err := CheckTable(tt.name)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalidTable)) {
			t.Errorf("CheckTable(%q) = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

func TestMillisRoundsUp(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want int64
	}{
		{0, 0}, {-time.Second, 0}, {time.Nanosecond, 1}, {time.Millisecond, 1},
		{time.Millisecond + 1, 2}, {300 * time.Millisecond, 300}, {24 * time.Hour, 86_400_000},
	}
	for _, tt := range tests {
		if got := millis(tt.d); got != tt.want {
			t.Errorf("millis(%v) = %d, want %d", tt.d, got, tt.want)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	if _, err := New(nil, testDialect(Question), Config{}); err == nil {
		t.Fatal("nil DB accepted")
	}
	db := SQL(nil)
	if _, err := New(db, testDialect(Question), Config{Table: "bad name"}); !errors.Is(err, ErrInvalidTable) {
		t.Fatalf("bad table: %v", err)
	}
	if _, err := New(db, testDialect(Question), Config{}); err == nil {
		t.Fatal("incomplete dialect accepted")
	}
}
