package headerval_test

import (
	"math"
	"testing"

	"github.com/idemq/idemq/internal/headerval"
)

func TestInt64(t *testing.T) {
	for _, tt := range []struct {
		v    any
		want int64
		ok   bool
	}{
		{int8(-3), -3, true}, {int16(7), 7, true}, {int32(8), 8, true}, {int64(math.MaxInt64), math.MaxInt64, true},
		{int(9), 9, true}, {uint8(1), 1, true}, {uint16(2), 2, true}, {uint32(3), 3, true},
		{uint64(math.MaxInt64), math.MaxInt64, true}, {uint64(math.MaxUint64), 0, false},
		{" 42 ", 42, true}, {[]byte("17"), 17, true}, {"1.5", 0, false}, {"x", 0, false},
		{1.0, 0, false}, {nil, 0, false}, {true, 0, false},
	} {
		got, ok := headerval.Int64(tt.v)
		if got != tt.want || ok != tt.ok {
			t.Errorf("Int64(%T %v) = %d, %v; want %d, %v", tt.v, tt.v, got, ok, tt.want, tt.ok)
		}
	}
}

func TestCount(t *testing.T) {
	for _, tt := range []struct {
		v    any
		want int64
		ok   bool
	}{
		{int64(3), 3, true}, {int32(2), 2, true}, {"4", 4, true}, {" 5 ", 5, true}, {[]byte("6"), 6, true},
		{int64(-9), 0, true}, {int64(math.MaxInt64), math.MaxInt32, true}, {uint64(math.MaxUint64), math.MaxInt32, true},
		{2.0, 2, true}, {float32(-1), 0, true}, {1e12, math.MaxInt32, true},
		{2.5, 0, false}, {math.NaN(), 0, false}, {math.Inf(1), 0, false}, {"abc", 0, false}, {nil, 0, false},
	} {
		got, ok := headerval.Count(tt.v)
		if got != tt.want || ok != tt.ok {
			t.Errorf("Count(%T %v) = %d, %v; want %d, %v", tt.v, tt.v, got, ok, tt.want, tt.ok)
		}
	}
}

func TestTruncate(t *testing.T) {
	tests := []struct {
		in    string
		limit int
		want  string
	}{
		{"hello", 10, "hello"}, {"hello", 3, "hel"}, {"héllo", 2, "h"}, {"héllo", 3, "hé"},
		{"abc", 0, "abc"}, {"a\xffb", 10, "a\uFFFDb"},
	}
	for _, tt := range tests {
		if got := headerval.Truncate(tt.in, tt.limit); got != tt.want {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tt.in, tt.limit, got, tt.want)
		}
	}
}

func TestInteger(t *testing.T) {
	for _, tt := range []struct {
		v    any
		want int64
		ok   bool
	}{
		{int(-1), -1, true}, {uint(7), 7, true}, {uint64(math.MaxUint64), 0, false}, {int64(math.MaxInt64), math.MaxInt64, true},
		{"42", 0, false}, {[]byte("1"), 0, false}, {1.0, 0, false}, {nil, 0, false},
	} {
		got, ok := headerval.Integer(tt.v)
		if got != tt.want || ok != tt.ok {
			t.Errorf("Integer(%T %v) = %d, %v; want %d, %v", tt.v, tt.v, got, ok, tt.want, tt.ok)
		}
	}
}
