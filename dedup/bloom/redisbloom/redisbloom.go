package redisbloom

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup/bloom"
)

// Config configures a [Filter]. The zero value is usable.
type Config struct {
	// Filter sizes the filter; every process sharing Prefix must use the
	// same sizing (the bit layout follows from it).
	Filter bloom.FilterConfig
	// Prefix names the filter inside the hash tag. Default "idemq:bloom".
	Prefix string
	// KeyPrefix is prepended outside the hash tag (e.g. "myapp:").
	KeyPrefix string
	// MaxShardBytes bounds one bitmap key; a generation larger than that is
	// split into shards (each its own hash tag, so Cluster spreads them),
	// an ID's bits all in one shard. Default 64 MiB; at most 512 MiB (the
	// Redis string limit).
	MaxShardBytes int64
	// Skew is the clock difference tolerated between consumer processes
	// (and Redis): lookups also read the next generation (writers a little
	// ahead) and keys live Skew past their last lookup. An ID is remembered
	// for at least Window minus the actual skew. Default min(1m, Window/G).
	Skew time.Duration
}

// Filter is the Redis rotating Bloom filter: per generation and shard a
// bitmap "{<prefix>:s<shard>}:gen:<index>" and a set-bit counter
// "{<prefix>:s<shard>}:bits:<index>". Generation indices come from the
// clock (floor(unix ms / L)); keys expire by themselves (PEXPIREAT the end
// of their last lookup plus Skew), so there is no rotation to coordinate
// among processes. Each Test and Add is one Lua script: one atomic round
// trip. It does not own the client.
type Filter struct {
	c         redis.UniversalClient
	cfg       Config
	p         bloom.Params
	now       func() time.Time
	shards    int
	shardBits uint64
}

var _ bloom.Filter = (*Filter)(nil)

// New returns a filter on client.
func New(client redis.UniversalClient, cfg Config) (*Filter, error) {
	p, err := cfg.Filter.Params()
	if err != nil {
		return nil, err
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "idemq:bloom"
	}
	if cfg.MaxShardBytes <= 0 {
		cfg.MaxShardBytes = 64 << 20
	}
	if cfg.MaxShardBytes > 512<<20 {
		return nil, fmt.Errorf("%w: MaxShardBytes %d past the 512 MiB Redis string limit", bloom.ErrInvalidConfig, cfg.MaxShardBytes)
	}
	if cfg.Skew <= 0 {
		cfg.Skew = min(time.Minute, p.GenLength)
	}
	f := &Filter{c: client, cfg: cfg, p: p, now: cfg.Filter.Now}
	if f.now == nil {
		f.now = time.Now
	}
	maxBits := uint64(cfg.MaxShardBytes) * 8
	f.shards = int((p.Bits + maxBits - 1) / maxBits)
	f.shardBits = (p.Bits + uint64(f.shards) - 1) / uint64(f.shards)
	if f.shards > 1 || cfg.Filter.Bits == 0 {
		f.shardBits = (f.shardBits + 63) &^ 63
	}
	return f, nil
}

// Params implements [bloom.Filter].
func (f *Filter) Params() bloom.Params { return f.p }

// Shards returns the number of bitmap keys per generation.
func (f *Filter) Shards() int { return f.shards }

func (f *Filter) tag(shard int) string {
	return f.cfg.KeyPrefix + "{" + f.cfg.Prefix + ":s" + strconv.Itoa(shard) + "}"
}

// BitmapKey is the key of a generation's bitmap in a shard.
func (f *Filter) BitmapKey(shard int, gen int64) string {
	return f.tag(shard) + ":gen:" + strconv.FormatInt(gen, 10)
}

// CounterKey is the key of a generation's set-bit counter in a shard.
func (f *Filter) CounterKey(shard int, gen int64) string {
	return f.tag(shard) + ":bits:" + strconv.FormatInt(gen, 10)
}

func (f *Filter) shardOf(key string) int {
	if f.shards == 1 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	return int(h.Sum64() % uint64(f.shards))
}

// locate returns the key's shard and its bit offsets as script arguments.
func (f *Filter) locate(key string, args []any) (int, []any) {
	var buf [32]uint64
	for _, l := range bloom.Locations(buf[:0], key, f.p.Hashes, f.shardBits) {
		args = append(args, l)
	}
	return f.shardOf(key), args
}

// testScript: KEYS the bitmaps of the checked generations, ARGV the bit
// offsets; 1 when every offset is set in one of them. A missing key reads
// as zeros.
var testScript = redis.NewScript(`
for i = 1, #KEYS do
  local all = 1
  for j = 1, #ARGV do
    if redis.call('GETBIT', KEYS[i], ARGV[j]) == 0 then all = 0 break end
  end
  if all == 1 then return 1 end
end
return 0
`)

// luaAddBits defines add_bits(bitmap, counter, expiry, last, first): sets
// the bits at ARGV[first..] in bitmap and returns how many flipped, counted
// in counter. A new bitmap is created at its full size at once (an exact
// allocation, rather than grown by doubling) with its expiry, which is
// fixed per generation; the bits are set by one BITFIELD (one command, not
// k SETBITs). Shared by addScript and the tiered store's Complete.
const luaAddBits = `
local function add_bits(bitmap, counter, expiry, last, first)
  if redis.call('EXISTS', bitmap) == 0 then
    redis.call('SETBIT', bitmap, last, 0)
    redis.call('PEXPIREAT', bitmap, expiry)
  end
  local ops = {}
  for i = first, #ARGV do
    ops[#ops + 1] = 'SET'; ops[#ops + 1] = 'u1'; ops[#ops + 1] = ARGV[i]; ops[#ops + 1] = 1
  end
  local old = redis.call('BITFIELD', bitmap, unpack(ops))
  local new = 0
  for i = 1, #old do
    if old[i] == 0 then new = new + 1 end
  end
  if new > 0 and redis.call('INCRBY', counter, new) == new then
    redis.call('PEXPIREAT', counter, expiry)
  end
  return new
end
`

// addScript: KEYS[1] the bitmap, KEYS[2] its set-bit counter; ARGV[1] the
// expiry (unix ms), ARGV[2] the last bit of the bitmap, ARGV[3..] the
// offsets.
var addScript = redis.NewScript(luaAddBits + `
return add_bits(KEYS[1], KEYS[2], ARGV[1], ARGV[2], 3)
`)

// checked returns the generations a lookup at c reads: c+1 (writers whose
// clock is ahead) down to c-G.
func (f *Filter) checked(c int64) []int64 {
	gens := make([]int64, 0, f.p.Checked+1)
	for i := c + 1; i > c-int64(f.p.Checked); i-- {
		gens = append(gens, i)
	}
	return gens
}

// Test implements [bloom.Filter].
func (f *Filter) Test(ctx context.Context, key string) (bool, error) {
	shard, args := f.locate(key, nil)
	gens := f.checked(f.p.Gen(f.now()))
	keys := make([]string, len(gens))
	for i, g := range gens {
		keys[i] = f.BitmapKey(shard, g)
	}
	n, err := testScript.Run(ctx, f.c, keys, args...).Int64()
	if err != nil {
		return false, fmt.Errorf("redisbloom: test: %w", err)
	}
	return n == 1, nil
}

// expireAt is when generation g's keys may go: the last lookup that reads
// it is at the end of generation g+G, plus Skew.
func (f *Filter) expireAt(g int64) int64 {
	return f.p.GenStart(g + int64(f.p.Checked)).Add(f.cfg.Skew).UnixMilli()
}

// Add implements [bloom.Filter].
func (f *Filter) Add(ctx context.Context, key string) error {
	g := f.p.Gen(f.now())
	shard, args := f.locate(key, []any{f.expireAt(g), f.shardBits - 1})
	err := addScript.Run(ctx, f.c, []string{f.BitmapKey(shard, g), f.CounterKey(shard, g)}, args...).Err()
	if err != nil {
		return fmt.Errorf("redisbloom: add: %w", err)
	}
	return nil
}

// Stats implements [bloom.Filter]: one GET per shard and checked
// generation (pipelined), no scan of the bitmaps.
func (f *Filter) Stats(ctx context.Context) (bloom.Stats, error) {
	gens := f.checked(f.p.Gen(f.now()))
	pipe := f.c.Pipeline()
	cmds := make([][]*redis.StringCmd, len(gens))
	for i, g := range gens {
		for s := 0; s < f.shards; s++ {
			cmds[i] = append(cmds[i], pipe.Get(ctx, f.CounterKey(s, g)))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return bloom.Stats{}, fmt.Errorf("redisbloom: stats: %w", err)
	}
	st := bloom.Stats{Params: f.p}
	var fills []float64
	for i, g := range gens {
		var set uint64
		exists := false
		for _, c := range cmds[i] {
			n, err := c.Uint64()
			if errors.Is(err, redis.Nil) {
				continue
			}
			if err != nil {
				return bloom.Stats{}, fmt.Errorf("redisbloom: stats: %w", err)
			}
			set += n
			exists = true
		}
		if !exists {
			continue
		}
		// Shards fill evenly: the per-shard fill is the average one.
		fill := float64(set) / float64(f.shardBits*uint64(f.shards))
		fills = append(fills, fill)
		st.Generations = append(st.Generations, bloom.GenStats{Index: g, Start: f.p.GenStart(g), SetBits: set, Fill: fill})
		st.Bytes += int64(f.shardBits/8) * int64(f.shards)
	}
	st.EstimatedFPRate = bloom.EstimateFP(fills, f.p.Hashes)
	return st, nil
}
