package redisbloom

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/bloom"
	"github.com/idemq/idemq/internal/redisrecord"
	"github.com/idemq/idemq/internal/redisscript"
)

// StoreConfig configures a [Store]. The zero value is usable (no verifier:
// filter hits that no recent marker answers are suspects).
type StoreConfig struct {
	// Filter is the filter's layout (sizing, prefix, shards, skew); every
	// process sharing it must use the same.
	Filter Config
	// Verifier answers filter hits that no lease or recent marker answers
	// (see bloom.StoreConfig.Verifier). When it also implements
	// bloom.Marker (bloom.RecordOfTruth), Complete marks done in it first.
	Verifier bloom.Verifier
	// Recent is how long an exact done marker is kept after Complete
	// (bounded by the window Complete is given): duplicates within it are
	// answered Done without a verifier. 0 means the default, 30s; negative
	// keeps no marker (the filter alone answers).
	Recent time.Duration
	// AutoPipeline sends the scripts through go-redis' autopipeliner, as
	// redisstore.Config.AutoPipeline does.
	AutoPipeline bool
	// Recorder receives the bloom counters. Default idemq.RecorderFrom(ctx).
	Recorder idemq.Recorder
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// Store is the tiered dedup store with both tiers in Redis, one script per
// operation: the exact lease (and recent done marker) of a key lives in
// the same hash slot as the filter shard that holds the key's bits
// ("{<prefix>:s<shard>}:rec:<key>"), so Claim reads the lease and, when
// there is none, the filter bits in one atomic round trip, and Complete
// turns the lease into done and sets the bits in another — the two round
// trips of the exact redisstore, at a few bytes per remembered ID instead
// of a key each.
//
// Claim: a live lease → InFlight (or Acquired for the same token); a done
// marker → Done; no record and the filter says "definitely not" → the
// lease is taken (Acquired). A filter hit ("maybe done") is answered by
// the Verifier: done → Done, not done (a false positive) → the lease is
// taken without the filter; no verifier → a *bloom.SuspectedDuplicateError
// (wrapping dedup.ErrUncertain: the guard neither runs nor acks it).
//
// With a record-of-truth verifier it passes dedup/storetest. It does not
// own the client.
type Store struct {
	c      redis.UniversalClient // single calls (the autopipeliner if asked for)
	raw    redis.UniversalClient // explicit pipelines of the batch calls
	f      *Filter
	cfg    StoreConfig
	marker bloom.Marker
}

var (
	_ dedup.Store      = (*Store)(nil)
	_ dedup.BatchStore = (*Store)(nil)
)

// NewStore returns a tiered store on client.
func NewStore(client redis.UniversalClient, cfg StoreConfig) (*Store, error) {
	raw := client
	if cfg.AutoPipeline {
		if ap, err := client.AutoPipeline(); err == nil {
			client = ap
		}
	}
	f, err := New(client, cfg.Filter)
	if err != nil {
		return nil, err
	}
	if cfg.Recent == 0 {
		cfg.Recent = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Store{c: client, raw: raw, f: f, cfg: cfg}
	s.marker, _ = cfg.Verifier.(bloom.Marker)
	return s, nil
}

// Filter returns the store's filter (Stats, key names).
func (s *Store) Filter() *Filter { return s.f }

// RecordKey is the Redis key of a dedup key's lease or done marker.
func (s *Store) RecordKey(key string) string { return s.f.tag(s.f.shardOf(key)) + ":rec:" + key }

func (s *Store) rec(ctx context.Context) idemq.Recorder {
	if s.cfg.Recorder != nil {
		return s.cfg.Recorder
	}
	return idemq.RecorderFrom(ctx)
}

// Records: "p:<token>" processing, owned by token (PX the lease); "d" a
// recent done marker (the record of internal/redisrecord, which also
// holds the release and extend scripts).
//
// tieredClaim: KEYS[1] the record, KEYS[2..] the checked bitmaps; ARGV[1]
// token, ARGV[2] lease ms, ARGV[3] 1 to skip the filter (a verified false
// positive), ARGV[4..] bit offsets. Replies {1,0} acquired, {2,pttl} in
// flight, {3,0} done, {4,0} maybe (nothing written).
var tieredClaim = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
local mine = 'p:' .. ARGV[1]
if v == mine then
  redis.call('SET', KEYS[1], mine, 'PX', ARGV[2])
  return {1, 0}
end
if v == 'd' then return {3, 0} end
if v then return {2, redis.call('PTTL', KEYS[1])} end
if ARGV[3] ~= '1' then
  for i = 2, #KEYS do
    local all = 1
    for j = 4, #ARGV do
      if redis.call('GETBIT', KEYS[i], ARGV[j]) == 0 then all = 0 break end
    end
    if all == 1 then return {4, 0} end
  end
end
redis.call('SET', KEYS[1], mine, 'PX', ARGV[2])
return {1, 0}
`)

// tieredComplete: KEYS[1] the record, KEYS[2] the current bitmap, KEYS[3]
// its set-bit counter; ARGV[1] token, ARGV[2] marker ms (0: none),
// ARGV[3] bitmap expiry (unix ms), ARGV[4] last bit, ARGV[5..] offsets.
// Replies 1 when processing(token) became done, 0 when the record was not
// ours but the key is now done (absent or done already), -1 when another
// token holds a live lease (nothing written).
var tieredComplete = redis.NewScript(luaAddBits + `
local v = redis.call('GET', KEYS[1])
local ours = 0
if v == 'p:' .. ARGV[1] then ours = 1
elseif v and v ~= 'd' then return -1 end
if ARGV[2] ~= '0' then
  redis.call('SET', KEYS[1], 'd', 'PX', ARGV[2])
else
  redis.call('DEL', KEYS[1])
end
add_bits(KEYS[2], KEYS[3], ARGV[3], ARGV[4], 5)
return ours
`)

// Claim implements [dedup.Store].
func (s *Store) Claim(ctx context.Context, key, token string, lease time.Duration) (dedup.Claim, error) {
	if err := dedup.CheckOp(ctx, "claim", key); err != nil {
		return dedup.Claim{}, err
	}
	c, err := s.claim(ctx, key, token, lease, false)
	if err != nil || c.Result != 0 {
		return c, err
	}
	return s.maybe(ctx, key, token, lease)
}

// maybe answers a filter hit ("maybe done": the filter holds the key's
// bits and no record answers) with the verifier, or as a suspect.
func (s *Store) maybe(ctx context.Context, key, token string, lease time.Duration) (dedup.Claim, error) {
	rec := s.rec(ctx)
	rec.Add(bloom.CountFilterHits, 1)
	if s.cfg.Verifier == nil {
		rec.Add(bloom.CountSuspects, 1)
		return dedup.Claim{}, &bloom.SuspectedDuplicateError{Key: key}
	}
	done, err := s.cfg.Verifier.Done(ctx, key)
	if err != nil {
		return dedup.Claim{}, dedup.WrapStoreError("claim", fmt.Errorf("bloom verifier: %w", err))
	}
	if done {
		rec.Add(bloom.CountVerifiedDone, 1)
		return dedup.Claim{Result: dedup.Done}, nil
	}
	rec.Add(bloom.CountFalsePositives, 1)
	return s.claim(ctx, key, token, lease, true)
}

// claim runs the claim script; Result 0 means "maybe" (a filter hit).
func (s *Store) claim(ctx context.Context, key, token string, lease time.Duration, skipFilter bool) (dedup.Claim, error) {
	keys, args := s.claimArgs(key, token, lease, skipFilter, s.f.checked(s.f.p.Gen(s.f.now())))
	return claimReply(tieredClaim.Run(ctx, s.c, keys, args...))
}

// claimArgs returns the keys and arguments of tieredClaim for key, checking
// the generations gens.
func (s *Store) claimArgs(key, token string, lease time.Duration, skipFilter bool, gens []int64) ([]string, []any) {
	skip := "0"
	if skipFilter {
		skip = "1"
	}
	shard, args := s.f.locate(key, []any{token, redisrecord.Millis(lease), skip})
	keys := make([]string, 1, len(gens)+1)
	keys[0] = s.RecordKey(key)
	for _, g := range gens {
		keys = append(keys, s.f.BitmapKey(shard, g))
	}
	return keys, args
}

// claimReply reads tieredClaim's reply; Result 0 means "maybe".
func claimReply(cmd *redis.Cmd) (dedup.Claim, error) {
	vals, err := cmd.Int64Slice()
	if err != nil {
		return dedup.Claim{}, dedup.WrapStoreError("claim", err)
	}
	if len(vals) == 2 && vals[0] == 4 {
		return dedup.Claim{}, nil
	}
	if c, ok := redisrecord.Claim(vals); ok {
		return c, nil
	}
	return dedup.Claim{}, dedup.WrapStoreError("claim", fmt.Errorf("unexpected script reply %v", vals))
}

// Complete implements [dedup.Store]: the record of truth first (when the
// verifier is a bloom.Marker), then, in one script, the lease becomes a
// done marker for min(window, Recent) and the key's bits are set in the
// current generation. The filter's own window applies to the bits (see
// bloom.Store.Complete on windows).
func (s *Store) Complete(ctx context.Context, key, token string, window time.Duration) error {
	if err := dedup.CheckOp(ctx, "complete", key); err != nil {
		return err
	}
	if s.marker != nil {
		if err := s.marker.MarkDone(ctx, key, window); err != nil {
			return dedup.WrapStoreError("complete", fmt.Errorf("bloom record of truth: %w", err))
		}
	}
	keys, args := s.completeArgs(key, token, window, s.f.p.Gen(s.f.now()))
	return s.completeReply(ctx, tieredComplete.Run(ctx, s.c, keys, args...), window)
}

// completeArgs returns the keys and arguments of tieredComplete for key in
// generation g.
func (s *Store) completeArgs(key, token string, window time.Duration, g int64) ([]string, []any) {
	var marker int64
	if s.cfg.Recent > 0 {
		marker = redisrecord.Millis(min(window, s.cfg.Recent))
	}
	shard, args := s.f.locate(key, []any{token, marker, s.f.expireAt(g), s.f.shardBits - 1})
	return []string{s.RecordKey(key), s.f.BitmapKey(shard, g), s.f.CounterKey(shard, g)}, args
}

func (s *Store) completeReply(ctx context.Context, cmd *redis.Cmd, window time.Duration) error {
	n, err := cmd.Int64()
	if err != nil {
		return dedup.WrapStoreError("complete", err)
	}
	if window > s.f.p.Window {
		s.rec(ctx).Add(bloom.CountWindowExceeded, 1)
	}
	if n != 1 {
		return dedup.ErrLeaseLost
	}
	return nil
}

// ClaimBatch implements [dedup.BatchStore]: one pipeline of claim scripts;
// the filter hits among them ("maybe done", rare) are answered as Claim
// answers them, up to sideCalls at once.
func (s *Store) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) []dedup.ClaimReply {
	out := make([]dedup.ClaimReply, len(reqs))
	var idx []int
	for i, r := range reqs {
		if err := dedup.CheckOp(ctx, "claim", r.Key); err != nil {
			out[i].Err = err
			continue
		}
		idx = append(idx, i)
	}
	gens := s.f.checked(s.f.p.Gen(s.f.now()))
	cmds := redisscript.Pipelined(ctx, s.raw, tieredClaim, len(idx), func(j int) ([]string, []any) {
		r := reqs[idx[j]]
		return s.claimArgs(r.Key, r.Token, r.Lease, false, gens)
	})
	// The filter hits go to the verifier (or the suspect path) side by
	// side: with a SQL verifier one by one would serialise every claim of
	// the process behind them.
	var g errgroup.Group
	g.SetLimit(sideCalls)
	for j, i := range idx {
		c, err := claimReply(cmds[j])
		if err != nil || c.Result != 0 {
			out[i] = dedup.ClaimReply{Claim: c, Err: err}
			continue
		}
		r := reqs[i]
		g.Go(func() error {
			c, err := s.maybe(ctx, r.Key, r.Token, r.Lease)
			out[i] = dedup.ClaimReply{Claim: c, Err: err}
			return nil
		})
	}
	_ = g.Wait()
	return out
}

// sideCalls bounds the record-of-truth and verifier calls of one batch
// that run at once.
const sideCalls = 16

// CompleteBatch implements [dedup.BatchStore]: the record of truth first
// (when the verifier is a bloom.Marker; up to sideCalls keys at once), then
// one pipeline of complete scripts for the keys it accepted.
func (s *Store) CompleteBatch(ctx context.Context, reqs []dedup.CompleteRequest) []error {
	out := make([]error, len(reqs))
	var g errgroup.Group
	g.SetLimit(sideCalls)
	for i, r := range reqs {
		if err := dedup.CheckOp(ctx, "complete", r.Key); err != nil {
			out[i] = err
			continue
		}
		if s.marker != nil {
			g.Go(func() error {
				if err := s.marker.MarkDone(ctx, r.Key, r.Window); err != nil {
					out[i] = dedup.WrapStoreError("complete", fmt.Errorf("bloom record of truth: %w", err))
				}
				return nil
			})
		}
	}
	_ = g.Wait()
	var idx []int
	for i := range reqs {
		if out[i] == nil {
			idx = append(idx, i)
		}
	}
	gen := s.f.p.Gen(s.f.now())
	cmds := redisscript.Pipelined(ctx, s.raw, tieredComplete, len(idx), func(j int) ([]string, []any) {
		r := reqs[idx[j]]
		return s.completeArgs(r.Key, r.Token, r.Window, gen)
	})
	for j, i := range idx {
		out[i] = s.completeReply(ctx, cmds[j], reqs[i].Window)
	}
	return out
}

func (s *Store) cas(ctx context.Context, op string, script *redis.Script, key string, args ...any) error {
	if err := dedup.CheckOp(ctx, op, key); err != nil {
		return err
	}
	n, err := script.Run(ctx, s.c, []string{s.RecordKey(key)}, args...).Int64()
	if err != nil {
		return dedup.WrapStoreError(op, err)
	}
	if n != 1 {
		return dedup.ErrLeaseLost
	}
	return nil
}

// Release implements [dedup.Store].
func (s *Store) Release(ctx context.Context, key, token string) error {
	return s.cas(ctx, "release", redisrecord.Release, key, token)
}

// Extend implements [dedup.Store].
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	return s.cas(ctx, "extend", redisrecord.Extend, key, token, redisrecord.Millis(lease))
}

// Stats returns the filter's stats.
func (s *Store) Stats(ctx context.Context) (bloom.Stats, error) { return s.f.Stats(ctx) }

// DuplicateLayer names the Bloom tier as the layer of the duplicates the
// dedup guard recognises through it (idemq.DuplicateLayer).
func (s *Store) DuplicateLayer() string { return idemq.LayerBloom }
