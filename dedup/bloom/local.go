package bloom

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Local is the in-process rotating filter: G+1 bitmaps of m bits, one per
// live generation, in a ring indexed by the time-derived generation index.
// Bits are set with atomic OR and read with atomic loads, so Test and Add
// are lock-free and safe for concurrent use; the mutex is taken only when a
// new generation begins (once per Window/G), to swap in a fresh bitmap
// (the one it replaces, G+1 generations old, is left to the GC).
type Local struct {
	p     Params
	now   func() time.Time
	mu    sync.Mutex // serialises rotation
	slots []atomic.Pointer[localGen]
}

type localGen struct {
	idx   int64
	words []uint64
	set   atomic.Uint64 // bits set so far (counted when an OR flips one)
}

var _ Filter = (*Local)(nil)

// NewLocal returns an in-process filter.
func NewLocal(cfg FilterConfig) (*Local, error) {
	p, err := cfg.Params()
	if err != nil {
		return nil, err
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	return &Local{p: p, now: now, slots: make([]atomic.Pointer[localGen], p.Checked)}, nil
}

// Params implements [Filter].
func (f *Local) Params() Params { return f.p }

func (f *Local) slot(i int64) *atomic.Pointer[localGen] {
	n := int64(len(f.slots))
	return &f.slots[((i%n)+n)%n]
}

// current returns the bitmap of generation c, creating it (and dropping
// the generation G+1 before it) when c has just begun.
func (f *Local) current(c int64) *localGen {
	s := f.slot(c)
	if g := s.Load(); g != nil && g.idx >= c {
		return g // a newer one only if the clock went back: remembered longer, never shorter
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if g := s.Load(); g != nil && g.idx >= c {
		return g
	}
	g := &localGen{idx: c, words: make([]uint64, (f.p.Bits+63)/64)}
	s.Store(g)
	return g
}

// Add implements [Filter]. It never fails.
func (f *Local) Add(_ context.Context, key string) error {
	g := f.current(f.p.Gen(f.now()))
	var buf [32]uint64
	for _, l := range Locations(buf[:0], key, f.p.Hashes, f.p.Bits) {
		mask := uint64(1) << (l % 64)
		if atomic.OrUint64(&g.words[l/64], mask)&mask == 0 {
			g.set.Add(1)
		}
	}
	return nil
}

// Test implements [Filter]. It never fails.
func (f *Local) Test(_ context.Context, key string) (bool, error) {
	c := f.p.Gen(f.now())
	var buf [32]uint64
	locs := Locations(buf[:0], key, f.p.Hashes, f.p.Bits)
	for i := c; i > c-int64(f.p.Checked); i-- {
		g := f.slot(i).Load()
		if g == nil || g.idx != i {
			continue
		}
		if g.has(locs) {
			return true, nil
		}
	}
	return false, nil
}

func (g *localGen) has(locs []uint64) bool {
	for _, l := range locs {
		if atomic.LoadUint64(&g.words[l/64])&(1<<(l%64)) == 0 {
			return false
		}
	}
	return true
}

// Stats implements [Filter].
func (f *Local) Stats(context.Context) (Stats, error) {
	c := f.p.Gen(f.now())
	st := Stats{Params: f.p}
	var fills []float64
	for i := c; i > c-int64(f.p.Checked); i-- {
		g := f.slot(i).Load()
		if g == nil || g.idx != i {
			continue
		}
		set := g.set.Load()
		fill := float64(set) / float64(f.p.Bits)
		fills = append(fills, fill)
		st.Generations = append(st.Generations, GenStats{Index: i, Start: f.p.GenStart(i), SetBits: set, Fill: fill})
	}
	for i := range f.slots {
		if g := f.slots[i].Load(); g != nil {
			st.Bytes += int64(len(g.words)) * 8
		}
	}
	st.EstimatedFPRate = EstimateFP(fills, f.p.Hashes)
	return st, nil
}
