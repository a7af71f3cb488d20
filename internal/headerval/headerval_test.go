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
