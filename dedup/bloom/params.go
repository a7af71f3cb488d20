package bloom

import (
	"fmt"
	"math"
	"time"

	bb "github.com/bits-and-blooms/bloom/v3"

	"github.com/idemq/idemq"
)

// FilterConfig sizes a rotating, time-windowed Bloom filter. The zero value
// is usable; the same config gives the same Params (and so the same bit
// layout) in every process, which the Redis filter relies on.
type FilterConfig struct {
	// Window is how long an added ID is remembered, at least. Default 24h.
	Window time.Duration
	// Generations (G) is how many generations the window is split into;
	// each lasts Window/G (rounded up to a whole millisecond). Default 4.
	Generations int
	// ExpectedIDs is the number of IDs added per Window. Default 1,000,000.
	ExpectedIDs uint64
	// FPRate is the target false-positive rate of a lookup (all live
	// generations together) once ExpectedIDs were added. Default 1e-4.
	FPRate float64
	// Bits and Hashes override the computed bits per generation and hash
	// count (both must be set): tests use a tiny filter to force false
	// positives. Bits is then used as is (not rounded).
	Bits   uint64
	Hashes int
	// Now is the clock (tests). Default time.Now.
	Now func() time.Time
}

// Defaults of [FilterConfig].
const (
	DefaultWindow      = 24 * time.Hour
	DefaultGenerations = 4
	DefaultExpectedIDs = 1_000_000
	DefaultFPRate      = 1e-4
)

// ErrInvalidConfig is wrapped by every configuration error of the Bloom
// filter, store and router (and of redisbloom's).
var ErrInvalidConfig = idemq.ConfigErrorClass("bloom: invalid configuration")

// Params is a sized filter. See the package documentation for the
// arithmetic.
type Params struct {
	Window      time.Duration
	Generations int           // G
	GenLength   time.Duration // L = ceil(Window/G), whole milliseconds
	// Checked is how many generations a lookup reads: the current one
	// (being filled) and the G before it, G+1 in all. An ID added in
	// generation i is found until generation i+G ends: at least G·L ≥
	// Window, at most (G+1)·L.
	Checked     int
	ExpectedIDs uint64  // n, per Window
	IDsPerGen   uint64  // n_g = ceil(n/G)
	FPRate      float64 // P, the target for a lookup
	GenFPRate   float64 // p_g = 1-(1-P)^(1/(G+1)), the target per generation
	Bits        uint64  // m, bits per generation
	Hashes      int     // k
}

// Params sizes the filter (see the package documentation).
func (c FilterConfig) Params() (Params, error) {
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Generations == 0 {
		c.Generations = DefaultGenerations
	}
	if c.ExpectedIDs == 0 {
		c.ExpectedIDs = DefaultExpectedIDs
	}
	if c.FPRate == 0 {
		c.FPRate = DefaultFPRate
	}
	switch {
	case c.Window < 0:
		return Params{}, fmt.Errorf("%w: negative Window %v", ErrInvalidConfig, c.Window)
	case c.Generations < 1 || c.Generations > 1024:
		return Params{}, fmt.Errorf("%w: Generations %d not in [1, 1024]", ErrInvalidConfig, c.Generations)
	case !(c.FPRate > 0 && c.FPRate < 1):
		return Params{}, fmt.Errorf("%w: FPRate %v not in (0, 1)", ErrInvalidConfig, c.FPRate)
	case (c.Bits == 0) != (c.Hashes == 0) || c.Hashes < 0:
		return Params{}, fmt.Errorf("%w: set both Bits and Hashes, or neither", ErrInvalidConfig)
	}
	g := c.Generations
	l := (c.Window + time.Duration(g) - 1) / time.Duration(g)
	l = (l + time.Millisecond - 1).Truncate(time.Millisecond)
	if l < time.Millisecond {
		l = time.Millisecond
	}
	p := Params{
		Window:      c.Window,
		Generations: g,
		GenLength:   l,
		Checked:     g + 1,
		ExpectedIDs: c.ExpectedIDs,
		IDsPerGen:   (c.ExpectedIDs + uint64(g) - 1) / uint64(g),
		FPRate:      c.FPRate,
		GenFPRate:   -math.Expm1(math.Log1p(-c.FPRate) / float64(g+1)),
	}
	if c.Bits > 0 {
		p.Bits, p.Hashes = c.Bits, c.Hashes
		return p, nil
	}
	n := float64(p.IDsPerGen)
	m := math.Ceil(-n * math.Log(p.GenFPRate) / (math.Ln2 * math.Ln2))
	for {
		bits := (uint64(m) + 63) &^ 63
		k := max(1, int(math.Round(float64(bits)/n*math.Ln2)))
		if TheoreticalFP(bits, k, p.IDsPerGen) <= p.GenFPRate || m > 1<<50 {
			p.Bits, p.Hashes = bits, k
			return p, nil
		}
		m = math.Ceil(m * 1.001) // k was rounded away from the optimum: a little more room
	}
}

// TheoreticalFP is the false-positive rate of one Bloom filter of m bits
// and k hashes holding n items: (1 - e^(-k·n/m))^k.
func TheoreticalFP(m uint64, k int, n uint64) float64 {
	return math.Pow(-math.Expm1(-float64(k)*float64(n)/float64(m)), float64(k))
}

// Gen is the generation index of t: floor(unix ms / L). Every process
// derives the same index from its clock; no rotation is coordinated.
func (p Params) Gen(t time.Time) int64 { return t.UnixMilli() / p.GenLength.Milliseconds() }

// GenStart is when generation i begins.
func (p Params) GenStart(i int64) time.Time {
	return time.UnixMilli(i * p.GenLength.Milliseconds())
}

// BytesPerID is the bitmap memory per ID of the window:
// (G+1)·m/8 / n.
func (p Params) BytesPerID() float64 {
	return float64(p.Checked) * float64(p.Bits) / 8 / float64(p.ExpectedIDs)
}

// EstimateFP is the false-positive rate of a lookup estimated from the
// fill ratio (set bits / m) of each checked generation: a fresh ID is a
// false positive in generation i with probability fill_i^k, so the lookup
// errs with 1 - Π(1 - fill_i^k).
func EstimateFP(fills []float64, k int) float64 {
	miss := 1.0
	for _, f := range fills {
		miss *= 1 - math.Pow(f, float64(k))
	}
	return 1 - miss
}

// Locations appends the k bit positions of key in a bitmap of m bits to
// dst: the double hashing of bits-and-blooms/bloom/v3 (murmur3, 128-bit)
// modulo m, so the in-process and the Redis filter agree bit for bit.
func Locations(dst []uint64, key string, k int, m uint64) []uint64 {
	for _, l := range bb.Locations([]byte(key), uint(k)) {
		dst = append(dst, l%m)
	}
	return dst
}
