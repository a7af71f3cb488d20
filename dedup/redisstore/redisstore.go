package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/redisrecord"
	"github.com/idemq/idemq/internal/redisscript"
)

// Config configures a [Store]. The zero value is usable.
type Config struct {
	// KeyPrefix is prepended to every Redis key, outside the hash tag
	// (e.g. "myapp:" to share a Redis with other data). Default "".
	// It is not the dedup key prefix: that is dedup.Config.Prefix, inside
	// the tag ("myapp:{idemq:<group>:<id>}"); see [Store.RedisKey].
	KeyPrefix string
	// AutoPipeline sends the store's commands through go-redis'
	// autopipeliner (client.AutoPipeline(), experimental in go-redis): calls
	// made concurrently by the consumer's workers share one pipelined round
	// trip instead of one each. Every call is still its own atomic script on
	// its own key, so batching changes nothing in the semantics. Ignored
	// (plain calls) for clients that do not support it (Ring). The
	// autopipeliner is released when the client is closed. Default false.
	AutoPipeline bool
	// WaitReplicas, when > 0, makes Complete (and CompleteBatch) send
	// WAIT WaitReplicas WaitTimeout after the records, on the same
	// connection: the call returns once that many replicas acknowledged
	// the done records, or WaitTimeout passed. Redis replication is
	// asynchronous: without it, a primary killed right after a Complete can
	// take the done record with it, and the promoted replica lets a
	// redelivery of the message run again (a duplicate, counted as such in
	// docs/GUARANTEES.md). WAIT narrows that window to records completed
	// while fewer replicas answered than asked for (counted by
	// [Store.WaitShortfalls]; the record is then on the primary only and
	// Complete still succeeds). It does not make Redis strongly consistent
	// (a replica that acknowledged may still lose the race for promotion).
	// Meant for a primary with replicas (Sentinel); with a Redis Cluster
	// client the WAIT goes to one node only. Default 0: no WAIT.
	WaitReplicas int
	// WaitTimeout bounds the WAIT. Keep it well below the client's
	// ReadTimeout (go-redis does not know WAIT blocks). Default 100ms.
	WaitTimeout time.Duration
}

// Store is a Redis dedup store. It does not own the client: close the
// client yourself.
type Store struct {
	client redis.UniversalClient // single calls (the autopipeliner if asked for)
	raw    redis.UniversalClient // explicit pipelines of the batch calls
	cfg    Config
	// oneScript: batches go as one batchScript call (a single-node
	// client: keys of different hash slots may share a script).
	oneScript bool

	waitShort atomic.Int64 // Completes whose WAIT saw fewer replicas than WaitReplicas

	cluster    *redis.ClusterClient // nil unless the client is one (followFailover)
	lastReload atomic.Int64         // UnixNano of the last slot map reload asked for
}

var (
	_ dedup.Store           = (*Store)(nil)
	_ dedup.BatchStore      = (*Store)(nil)
	_ dedup.MixedBatchStore = (*Store)(nil)
	_ dedup.Inspector       = (*Store)(nil)
	_ dedup.IdleForgetter   = (*Store)(nil)
)

// ErrInvalidConfig is wrapped by every error [Config.Validate] returns.
var ErrInvalidConfig = idemq.ConfigErrorClass("redisstore: invalid config")

// ErrNoClient is returned by [New] without a Redis client.
var ErrNoClient = errors.New("redisstore: a Redis client is required")

// Validate reports a configuration [New] refuses: a negative WaitReplicas
// or WaitTimeout.
func (c Config) Validate() error {
	if c.WaitReplicas < 0 || c.WaitTimeout < 0 {
		return fmt.Errorf("%w: negative WaitReplicas %d or WaitTimeout %v", ErrInvalidConfig, c.WaitReplicas, c.WaitTimeout)
	}
	return nil
}

// New validates cfg and returns a store on client (any go-redis v9
// client: single node, Sentinel failover, Cluster).
func New(client redis.UniversalClient, cfg Config) (*Store, error) {
	if client == nil {
		return nil, ErrNoClient
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.WaitReplicas > 0 && cfg.WaitTimeout <= 0 {
		cfg.WaitTimeout = 100 * time.Millisecond
	}
	s := &Store{client: client, raw: client, cfg: cfg}
	switch c := client.(type) {
	case *redis.ClusterClient:
		s.cluster = c
	case *redis.Ring:
	default:
		s.oneScript = true
	}
	if cfg.AutoPipeline {
		if ap, err := client.AutoPipeline(); err == nil {
			s.client = ap
		}
	}
	return s, nil
}

// RedisKey is the Redis key that holds the record of a guard key.
func (s *Store) RedisKey(key string) string { return s.cfg.KeyPrefix + "{" + key + "}" }

// Values: "p:<token>" = processing, owned by token; "d" = done (the
// record of internal/redisrecord, which also holds the release and extend
// scripts).
//
// A claim first tries SET key p:<token> NX PX lease, which takes a new key
// with a plain command (no script for Redis to run); only when the key
// exists does it run claimScript to tell done, in flight and "already
// mine" apart. Both steps are atomic on their own and the second decides
// from what it reads, so a key that changes between them is answered
// correctly.
//
// claimScript returns {1, 0} acquired, {2, pttl} in flight, {3, 0} done.
var claimScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
local mine = 'p:' .. ARGV[1]
if not v or v == mine then
  redis.call('SET', KEYS[1], mine, 'PX', ARGV[2])
  return {1, 0}
end
if v == 'd' then
  return {3, 0}
end
return {2, redis.call('PTTL', KEYS[1])}
`)

// Complete returns 1 when processing(token) became done, 0 otherwise; an
// absent record (the lease expired, nobody took it) is still marked done.
var completeScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == 'p:' .. ARGV[1] then
  redis.call('SET', KEYS[1], 'd', 'PX', ARGV[2])
  return 1
end
if not v then
  redis.call('SET', KEYS[1], 'd', 'PX', ARGV[2])
end
return 0
`)

// batchScript answers a whole batch in one script call: KEYS are the
// claims' keys, then the completes' keys; ARGV[1] is the number of claims,
// then a token and a lease (ms) per claim, then a token and a window (ms)
// per complete. Each claim and complete does what Claim (SET NX, then the
// claim script) and the complete script do, claims first, in order. The
// reply is a code and a PTTL per claim (1 acquired, 2 in flight, 3 done),
// then 1 or 0 per complete. A key that holds another type (GET answers
// WRONGTYPE) fails its own request only: claim code 4, complete -1. One
// script call instead of a command per key
// spares Redis the per-command (and per-script) overhead and the client a
// reply per key. Keys of one call may be in different hash slots, so it is
// used with single-node clients only (not Cluster, not Ring).
var batchScript = redis.NewScript(`
local nc = tonumber(ARGV[1])
local out = {}
local a = 2
local function get(k)
  local v = redis.pcall('GET', k)
  if type(v) == 'table' and v.err then
    return nil, true
  end
  return v, false
end
for i = 1, nc do
  local k, mine, lease = KEYS[i], 'p:' .. ARGV[a], ARGV[a + 1]
  a = a + 2
  if redis.call('SET', k, mine, 'NX', 'PX', lease) then
    out[#out + 1] = 1
    out[#out + 1] = 0
  else
    local v, bad = get(k)
    if bad then
      out[#out + 1] = 4
      out[#out + 1] = 0
    elseif not v or v == mine then
      redis.call('SET', k, mine, 'PX', lease)
      out[#out + 1] = 1
      out[#out + 1] = 0
    elseif v == 'd' then
      out[#out + 1] = 3
      out[#out + 1] = 0
    else
      out[#out + 1] = 2
      out[#out + 1] = redis.call('PTTL', k)
    end
  end
end
for i = nc + 1, #KEYS do
  local k = KEYS[i]
  local v, bad = get(k)
  if bad then
    out[#out + 1] = -1
  elseif v == 'p:' .. ARGV[a] then
    redis.call('SET', k, 'd', 'PX', ARGV[a + 1])
    out[#out + 1] = 1
  else
    if not v then
      redis.call('SET', k, 'd', 'PX', ARGV[a + 1])
    end
    out[#out + 1] = 0
  end
  a = a + 2
end
return out
`)

var getScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then
  return {}
end
return {v, redis.call('PTTL', KEYS[1])}
`)

// forgetIdleScript deletes a done record and keeps a lease (live: Redis
// expires leases) or a value that is not a dedup record. It returns {}
// absent, {1, v, pttl} deleted, {0, v, pttl} kept.
var forgetIdleScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then
  return {}
end
local pttl = redis.call('PTTL', KEYS[1])
if v ~= 'd' then
  return {0, v, pttl}
end
redis.call('DEL', KEYS[1])
return {1, v, pttl}
`)

// errNotRecord: a key of the batch holds a value of another type (not a
// dedup record); only its own request fails.
var errNotRecord = errors.New("redisstore: not a dedup record")

func storeErr(op string, err error) error { return &dedup.StoreError{Op: op, Err: err} }

// storeErr wraps a failed call's error, and on a cluster asks the client
// to reload its slot map (see followFailover).
func (s *Store) storeErr(op string, err error) error {
	s.followFailover(err)
	return storeErr(op, err)
}

// followFailover makes a cluster client reload its slot map after a call
// failed. go-redis reloads it on a MOVED or ASK reply, and otherwise only
// every ClusterStateReloadInterval (60 s by default): after a primary is
// killed, nothing answers MOVED, so every call for its slots kept dialing
// the dead node for up to a minute after its replica had taken over
// (measured: TestClusterPrimaryKilled). The reload is asynchronous, one at
// a time, at most every 250 ms.
func (s *Store) followFailover(err error) {
	if s.cluster == nil || err == nil || errors.Is(err, context.Canceled) {
		return
	}
	now := time.Now().UnixNano()
	last := s.lastReload.Load()
	if now-last < int64(250*time.Millisecond) || !s.lastReload.CompareAndSwap(last, now) {
		return
	}
	s.cluster.ReloadState(context.Background())
}

func (s *Store) prepare(ctx context.Context, op, key string) error {
	if err := dedup.ValidateKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return s.storeErr(op, err)
	}
	return nil
}

// Claim implements [dedup.Store].
func (s *Store) Claim(ctx context.Context, key, token string, lease time.Duration) (dedup.Claim, error) {
	if err := s.prepare(ctx, "claim", key); err != nil {
		return dedup.Claim{}, err
	}
	rk := s.RedisKey(key)
	ok, err := s.client.SetNX(ctx, rk, redisrecord.Processing(token), msDuration(lease)).Result()
	if err != nil {
		return dedup.Claim{}, s.storeErr("claim", err)
	}
	if ok {
		return dedup.Claim{Result: dedup.Acquired}, nil
	}
	vals, err := claimScript.Run(ctx, s.client, []string{rk}, token, redisrecord.Millis(lease)).Int64Slice()
	if err != nil {
		return dedup.Claim{}, s.storeErr("claim", err)
	}
	return claimResult(vals)
}

// msDuration rounds d up to whole milliseconds (at least 1), so go-redis
// sends PX, as the scripts do.
func msDuration(d time.Duration) time.Duration {
	return time.Duration(redisrecord.Millis(d)) * time.Millisecond
}

// ClaimBatch implements [dedup.BatchStore]: as [Store.Batch] without
// completes (one script call on a single-node client; on Cluster and Ring
// one pipeline of SET NX, then one of claim scripts for the keys that
// existed).
func (s *Store) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) []dedup.ClaimReply {
	claims, _ := s.Batch(ctx, reqs, nil)
	return claims
}

// Batch implements [dedup.MixedBatchStore]. On a single-node client it is
// one call of batchScript. On Cluster and Ring (keys of a batch are in
// different slots): one pipeline holds a SET NX per
// claim and a complete script per complete; a second one runs the claim
// script for the claimed keys that existed (a duplicate, a lease held
// elsewhere), and, the first time, the complete scripts Redis did not have
// cached. A claim on a key that a complete of the same call is on goes as
// the claim script (EVAL) in the first pipeline, before the completes, so
// claims are answered first as the contract says. With WaitReplicas the
// completes follow in their own pipeline, with their WAIT.
func (s *Store) Batch(ctx context.Context, claims []dedup.ClaimRequest, completes []dedup.CompleteRequest) ([]dedup.ClaimReply, []error) {
	if s.cfg.WaitReplicas > 0 && len(completes) > 0 {
		out, _ := s.Batch(ctx, claims, nil)
		return out, s.CompleteBatch(ctx, completes)
	}
	if s.oneScript {
		return s.batchOneScript(ctx, claims, completes)
	}
	out := make([]dedup.ClaimReply, len(claims))
	var done []error
	var completing map[string]bool
	if len(completes) > 0 && len(claims) > 0 {
		completing = make(map[string]bool, len(completes))
		for _, r := range completes {
			completing[r.Key] = true
		}
	}
	var scripted map[int]*redis.Cmd // claims sent as the script
	pipe := s.raw.Pipeline()
	setnx := make([]*redis.BoolCmd, len(claims))
	for i, r := range claims {
		if err := s.prepare(ctx, "claim", r.Key); err != nil {
			out[i].Err = err
			continue
		}
		if completing[r.Key] {
			if scripted == nil {
				scripted = make(map[int]*redis.Cmd)
			}
			scripted[i] = claimScript.Eval(ctx, pipe, []string{s.RedisKey(r.Key)}, r.Token, redisrecord.Millis(r.Lease))
			continue
		}
		setnx[i] = pipe.SetNX(ctx, s.RedisKey(r.Key), redisrecord.Processing(r.Token), msDuration(r.Lease))
	}
	var cidx []int
	var ccmds []*redis.Cmd
	if completes != nil {
		done = make([]error, len(completes))
		for i, r := range completes {
			if err := s.prepare(ctx, "complete", r.Key); err != nil {
				done[i] = err
				continue
			}
			cidx = append(cidx, i)
			keys, a := completeArgs(s, r)
			ccmds = append(ccmds, completeScript.EvalSha(ctx, pipe, keys, a...))
		}
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(ctx) // errors are read per command
	}
	var exists []int
	for i, c := range setnx {
		if c == nil {
			continue
		}
		ok, err := c.Result()
		switch {
		case err != nil:
			out[i].Err = s.storeErr("claim", err)
		case ok:
			out[i].Claim = dedup.Claim{Result: dedup.Acquired}
		default:
			exists = append(exists, i)
		}
	}
	for i, c := range scripted {
		vals, err := c.Int64Slice()
		if err != nil {
			out[i].Err = s.storeErr("claim", err)
			continue
		}
		out[i].Claim, out[i].Err = claimResult(vals)
	}
	// Completes whose script was not cached yet: again, as EVAL.
	var missing []int
	for j, c := range ccmds {
		if err := c.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			missing = append(missing, j)
		}
	}
	if len(exists) == 0 && len(missing) == 0 {
		s.completeResults(done, cidx, ccmds)
		return out, done
	}
	pipe = s.raw.Pipeline()
	for _, j := range missing {
		keys, a := completeArgs(s, completes[cidx[j]])
		ccmds[j] = completeScript.Eval(ctx, pipe, keys, a...)
	}
	if len(missing) > 0 {
		_, _ = pipe.Exec(ctx)
	}
	s.completeResults(done, cidx, ccmds)
	if len(exists) == 0 {
		return out, done
	}
	cmds := redisscript.Pipelined(ctx, s.raw, claimScript, len(exists), func(j int) ([]string, []any) {
		r := claims[exists[j]]
		return []string{s.RedisKey(r.Key)}, []any{r.Token, redisrecord.Millis(r.Lease)}
	})
	for j, i := range exists {
		vals, err := cmds[j].Int64Slice()
		if err != nil {
			out[i].Err = s.storeErr("claim", err)
			continue
		}
		out[i].Claim, out[i].Err = claimResult(vals)
	}
	return out, done
}

// msBox boxes durations as script arguments (milliseconds), the last one
// kept: the requests of a batch share their lease or window, so a batch
// boxes each once instead of once per request.
type msBox struct {
	last time.Duration
	v    any
}

func (b *msBox) ms(d time.Duration) any {
	if b.v == nil || d != b.last {
		b.last, b.v = d, redisrecord.Millis(d)
	}
	return b.v
}

// batchOneScript is Batch as one call of batchScript.
func (s *Store) batchOneScript(ctx context.Context, claims []dedup.ClaimRequest, completes []dedup.CompleteRequest) ([]dedup.ClaimReply, []error) {
	out := make([]dedup.ClaimReply, len(claims))
	var done []error
	if len(completes) > 0 {
		done = make([]error, len(completes))
	}
	keys := make([]string, 0, len(claims)+len(completes))
	args := make([]any, 1, 1+2*(len(claims)+len(completes)))
	var ci, di []int
	var box msBox
	for i, r := range claims {
		if err := s.prepare(ctx, "claim", r.Key); err != nil {
			out[i].Err = err
			continue
		}
		ci = append(ci, i)
		keys = append(keys, s.RedisKey(r.Key))
		args = append(args, r.Token, box.ms(r.Lease))
	}
	args[0] = len(ci)
	for i, r := range completes {
		if err := s.prepare(ctx, "complete", r.Key); err != nil {
			done[i] = err
			continue
		}
		di = append(di, i)
		keys = append(keys, s.RedisKey(r.Key))
		args = append(args, r.Token, box.ms(max(r.Window, time.Millisecond)))
	}
	if len(keys) == 0 {
		return out, done
	}
	vals, err := batchScript.Run(ctx, s.raw, keys, args...).Int64Slice() // EVALSHA; EVAL after NOSCRIPT
	if err == nil && len(vals) != 2*len(ci)+len(di) {
		err = fmt.Errorf("unexpected batch script reply of %d values for %d claims and %d completes", len(vals), len(ci), len(di))
	}
	if err != nil {
		for _, i := range ci {
			out[i].Err = s.storeErr("claim", err)
		}
		for _, i := range di {
			done[i] = s.storeErr("complete", err)
		}
		return out, done
	}
	for j, i := range ci {
		if vals[2*j] == 4 {
			out[i].Err = s.storeErr("claim", fmt.Errorf("%w: key %q holds another type", errNotRecord, keys[j]))
			continue
		}
		out[i].Claim, out[i].Err = claimResult(vals[2*j : 2*j+2])
	}
	for j, i := range di {
		switch vals[2*len(ci)+j] {
		case 1:
		case -1:
			done[i] = s.storeErr("complete", fmt.Errorf("%w: key %q holds another type", errNotRecord, keys[len(ci)+j]))
		default:
			done[i] = dedup.ErrLeaseLost
		}
	}
	return out, done
}

// completeArgs are the keys and arguments of the complete script for r.
func completeArgs(s *Store, r dedup.CompleteRequest) ([]string, []any) {
	return []string{s.RedisKey(r.Key)}, []any{r.Token, redisrecord.Millis(max(r.Window, time.Millisecond))}
}

// completeResults reads the replies of the complete scripts cmds (of the
// completes at positions idx) into out.
func (s *Store) completeResults(out []error, idx []int, cmds []*redis.Cmd) {
	for j, i := range idx {
		n, err := cmds[j].Int64()
		switch {
		case err != nil:
			out[i] = s.storeErr("complete", err)
		case n != 1:
			out[i] = dedup.ErrLeaseLost
		}
	}
}

// CompleteBatch implements [dedup.BatchStore]: one script call on a
// single-node client, one pipeline of complete scripts on Cluster and
// Ring, or with WaitReplicas (then followed by the WAIT).
func (s *Store) CompleteBatch(ctx context.Context, reqs []dedup.CompleteRequest) []error {
	if s.oneScript && s.cfg.WaitReplicas <= 0 {
		_, done := s.batchOneScript(ctx, nil, reqs)
		return done
	}
	out := make([]error, len(reqs))
	var idx []int
	for i, r := range reqs {
		if err := s.prepare(ctx, "complete", r.Key); err != nil {
			out[i] = err
			continue
		}
		idx = append(idx, i)
	}
	if len(idx) == 0 {
		return out
	}
	args := func(j int) ([]string, []any) { return completeArgs(s, reqs[idx[j]]) }
	var cmds []*redis.Cmd
	if s.cfg.WaitReplicas > 0 {
		cmds = s.completeAndWait(ctx, len(idx), args)
	} else {
		cmds = redisscript.Pipelined(ctx, s.raw, completeScript, len(idx), args)
	}
	s.completeResults(out, idx, cmds)
	return out
}

func claimResult(vals []int64) (dedup.Claim, error) {
	if c, ok := redisrecord.Claim(vals); ok {
		return c, nil
	}
	return dedup.Claim{}, storeErr("claim", fmt.Errorf("unexpected script reply %v", vals))
}

// cas runs a compare-and-set script that returns 1 on success.
func (s *Store) cas(ctx context.Context, op string, script *redis.Script, key, token string, d time.Duration) error {
	if err := s.prepare(ctx, op, key); err != nil {
		return err
	}
	args := []any{token}
	if d != 0 {
		args = append(args, redisrecord.Millis(d))
	}
	n, err := script.Run(ctx, s.client, []string{s.RedisKey(key)}, args...).Int64()
	if err != nil {
		return s.storeErr(op, err)
	}
	if n != 1 {
		return dedup.ErrLeaseLost
	}
	return nil
}

// Complete implements [dedup.Store].
func (s *Store) Complete(ctx context.Context, key, token string, window time.Duration) error {
	if s.cfg.WaitReplicas > 0 {
		errs := s.CompleteBatch(ctx, []dedup.CompleteRequest{{Key: key, Token: token, Window: window}})
		return errs[0]
	}
	return s.cas(ctx, "complete", completeScript, key, token, max(window, time.Millisecond))
}

// completeAndWait runs n complete scripts and a WAIT in one pipeline: WAIT
// counts the replicas that caught up with the writes of its own
// connection, so it must follow them on the same one. The scripts go as
// EVAL (Redis caches the compiled script either way): an EVALSHA that met
// NOSCRIPT would need a second pipeline, and a second WAIT.
func (s *Store) completeAndWait(ctx context.Context, n int, args redisscript.Args) []*redis.Cmd {
	cmds := make([]*redis.Cmd, n)
	pipe := s.raw.Pipeline()
	for i := range n {
		keys, a := args(i)
		cmds[i] = completeScript.Eval(ctx, pipe, keys, a...)
	}
	wait := pipe.Do(ctx, "WAIT", s.cfg.WaitReplicas, s.cfg.WaitTimeout.Milliseconds())
	_, _ = pipe.Exec(ctx) // errors are read per command
	if acked, err := wait.Int64(); err == nil && acked < int64(s.cfg.WaitReplicas) {
		s.waitShort.Add(1)
	}
	return cmds
}

// WaitShortfalls counts the Complete and CompleteBatch calls whose WAIT
// saw fewer replicas than Config.WaitReplicas within Config.WaitTimeout:
// their records were on the primary only when the call returned.
func (s *Store) WaitShortfalls() int64 { return s.waitShort.Load() }

// Release implements [dedup.Store].
func (s *Store) Release(ctx context.Context, key, token string) error {
	return s.cas(ctx, "release", redisrecord.Release, key, token, 0)
}

// Extend implements [dedup.Store].
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	return s.cas(ctx, "extend", redisrecord.Extend, key, token, max(lease, time.Millisecond))
}

// Get implements [dedup.Inspector].
func (s *Store) Get(ctx context.Context, key string) (dedup.Record, bool, error) {
	if err := s.prepare(ctx, "get", key); err != nil {
		return dedup.Record{}, false, err
	}
	now := time.Now()
	vals, err := getScript.Run(ctx, s.client, []string{s.RedisKey(key)}).Slice()
	if err != nil {
		return dedup.Record{}, false, s.storeErr("get", err)
	}
	if len(vals) == 0 {
		return dedup.Record{}, false, nil
	}
	rec, err := s.record(key, vals[0], vals[1], now)
	if err != nil {
		return dedup.Record{}, false, s.storeErr("get", err)
	}
	return rec, true, nil
}

// record decodes a value and its PTTL as read by a script.
func (s *Store) record(key string, val, ttl any, now time.Time) (dedup.Record, error) {
	v, _ := val.(string)
	pttl, _ := ttl.(int64)
	rec := dedup.Record{Key: key}
	if pttl > 0 {
		rec.ExpiresAt = now.Add(time.Duration(pttl) * time.Millisecond)
	}
	owner, processing := redisrecord.Owner(v)
	switch {
	case v == redisrecord.Done:
		rec.State = dedup.StateDone
	case processing:
		rec.State = dedup.StateProcessing
		rec.Owner = owner
	default:
		return dedup.Record{}, fmt.Errorf("key %q holds %q, not a dedup record", s.RedisKey(key), v)
	}
	return rec, nil
}

// ForgetIdle implements [dedup.IdleForgetter]: one script reads the record
// and deletes it unless it is a lease (Redis expires leases itself, so a
// lease it finds is live).
func (s *Store) ForgetIdle(ctx context.Context, key string) (dedup.Record, bool, error) {
	if err := s.prepare(ctx, "forget", key); err != nil {
		return dedup.Record{}, false, err
	}
	now := time.Now()
	vals, err := forgetIdleScript.Run(ctx, s.client, []string{s.RedisKey(key)}).Slice()
	if err != nil {
		return dedup.Record{}, false, s.storeErr("forget", err)
	}
	if len(vals) == 0 {
		return dedup.Record{}, false, nil
	}
	if len(vals) != 3 {
		return dedup.Record{}, false, s.storeErr("forget", fmt.Errorf("unexpected script reply %v", vals))
	}
	rec, err := s.record(key, vals[1], vals[2], now)
	if err != nil {
		// Not a dedup record: the script left it alone.
		return dedup.Record{}, false, s.storeErr("forget", err)
	}
	if deleted, _ := vals[0].(int64); deleted != 1 {
		return rec, true, fmt.Errorf("%w: %s is processing, owner %s", dedup.ErrLeaseHeld, key, rec.Owner)
	}
	return rec, true, nil
}

// Forget implements [dedup.Inspector].
func (s *Store) Forget(ctx context.Context, key string) error {
	if err := s.prepare(ctx, "forget", key); err != nil {
		return err
	}
	if err := s.client.Del(ctx, s.RedisKey(key)).Err(); err != nil {
		return s.storeErr("forget", err)
	}
	return nil
}
