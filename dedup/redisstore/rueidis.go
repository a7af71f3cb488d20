package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/idemq/idemq/dedup"
)

// RueidisStore is the Redis dedup store on a github.com/redis/rueidis
// client instead of go-redis: the same Lua scripts, key layout and values
// as [Store], so both read and write the same records. rueidis pipelines
// the commands of concurrent callers on a shared connection by itself
// (auto-pipelining) and speaks RESP3. It does not own the client: close
// the client yourself.
//
// Experimental (issue 20): kept next to [Store] to compare the two clients
// in the same benchmark run. Config.AutoPipeline is ignored (rueidis
// always pipelines); Config.WaitReplicas is not supported.
type RueidisStore struct {
	client rueidis.Client
	cfg    Config
	// oneScript: batches go as one batchLua call (not a Cluster client).
	oneScript bool
}

var (
	_ dedup.Store           = (*RueidisStore)(nil)
	_ dedup.BatchStore      = (*RueidisStore)(nil)
	_ dedup.MixedBatchStore = (*RueidisStore)(nil)
	_ dedup.Inspector       = (*RueidisStore)(nil)
	_ dedup.IdleForgetter   = (*RueidisStore)(nil)
)

// ErrWaitUnsupported is returned by [NewRueidis] for a Config with
// WaitReplicas: the rueidis backend does not send WAIT.
var ErrWaitUnsupported = errors.New("redisstore: WaitReplicas is not supported with a rueidis client")

var (
	rClaim      = rueidis.NewLuaScript(claimLua)
	rComplete   = rueidis.NewLuaScript(completeLua)
	rBatch      = rueidis.NewLuaScript(batchLua)
	rRelease    = rueidis.NewLuaScript(releaseLua)
	rExtend     = rueidis.NewLuaScript(extendLua)
	rGet        = rueidis.NewLuaScript(getLua)
	rForgetIdle = rueidis.NewLuaScript(forgetIdleLua)
)

// NewRueidis validates cfg and returns a store on a rueidis client
// (standalone, Sentinel or Cluster).
func NewRueidis(client rueidis.Client, cfg Config) (*RueidisStore, error) {
	if client == nil {
		return nil, ErrNoClient
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.WaitReplicas > 0 {
		return nil, ErrWaitUnsupported
	}
	return &RueidisStore{client: client, cfg: cfg, oneScript: client.Mode() != rueidis.ClientModeCluster}, nil
}

// RedisKey is the Redis key that holds the record of a guard key.
func (s *RueidisStore) RedisKey(key string) string { return s.cfg.KeyPrefix + "{" + key + "}" }

func (s *RueidisStore) prepare(ctx context.Context, op, key string) error {
	if err := dedup.ValidateKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return storeErr(op, err)
	}
	return nil
}

func msArg(d time.Duration) string { return strconv.FormatInt(ms(d), 10) }

// Claim implements [dedup.Store]: SET NX PX, then the claim script when
// the key exists, as [Store.Claim].
func (s *RueidisStore) Claim(ctx context.Context, key, token string, lease time.Duration) (dedup.Claim, error) {
	if err := s.prepare(ctx, "claim", key); err != nil {
		return dedup.Claim{}, err
	}
	rk := s.RedisKey(key)
	err := s.client.Do(ctx, s.client.B().Set().Key(rk).Value("p:"+token).Nx().PxMilliseconds(ms(lease)).Build()).Error()
	switch {
	case err == nil:
		return dedup.Claim{Result: dedup.Acquired}, nil
	case !rueidis.IsRedisNil(err):
		return dedup.Claim{}, storeErr("claim", err)
	}
	vals, err := rClaim.Exec(ctx, s.client, []string{rk}, []string{token, msArg(lease)}).AsIntSlice()
	if err != nil {
		return dedup.Claim{}, storeErr("claim", err)
	}
	return claimResult(vals)
}

// ClaimBatch implements [dedup.BatchStore].
func (s *RueidisStore) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) []dedup.ClaimReply {
	claims, _ := s.Batch(ctx, reqs, nil)
	return claims
}

// CompleteBatch implements [dedup.BatchStore].
func (s *RueidisStore) CompleteBatch(ctx context.Context, reqs []dedup.CompleteRequest) []error {
	_, done := s.Batch(ctx, nil, reqs)
	return done
}

// Batch implements [dedup.MixedBatchStore]: one call of the batch script
// on a standalone or Sentinel client; on a Cluster client one claim or
// complete script per request, pipelined by rueidis (claims first).
func (s *RueidisStore) Batch(ctx context.Context, claims []dedup.ClaimRequest, completes []dedup.CompleteRequest) ([]dedup.ClaimReply, []error) {
	out := make([]dedup.ClaimReply, len(claims))
	var done []error
	if len(completes) > 0 {
		done = make([]error, len(completes))
	}
	keys := make([]string, 0, len(claims)+len(completes))
	args := make([]string, 1, 1+2*(len(claims)+len(completes)))
	var ci, di []int
	for i, r := range claims {
		if err := s.prepare(ctx, "claim", r.Key); err != nil {
			out[i].Err = err
			continue
		}
		ci = append(ci, i)
		keys = append(keys, s.RedisKey(r.Key))
		args = append(args, r.Token, msArg(r.Lease))
	}
	args[0] = strconv.Itoa(len(ci))
	for i, r := range completes {
		if err := s.prepare(ctx, "complete", r.Key); err != nil {
			done[i] = err
			continue
		}
		di = append(di, i)
		keys = append(keys, s.RedisKey(r.Key))
		args = append(args, r.Token, msArg(max(r.Window, time.Millisecond)))
	}
	if len(keys) == 0 {
		return out, done
	}
	if !s.oneScript {
		s.batchPerKey(ctx, keys, args[1:], ci, di, out, done)
		return out, done
	}
	vals, err := rBatch.Exec(ctx, s.client, keys, args).AsIntSlice()
	if err == nil && len(vals) != 2*len(ci)+len(di) {
		err = fmt.Errorf("unexpected batch script reply of %d values for %d claims and %d completes", len(vals), len(ci), len(di))
	}
	if err != nil {
		for _, i := range ci {
			out[i].Err = storeErr("claim", err)
		}
		for _, i := range di {
			done[i] = storeErr("complete", err)
		}
		return out, done
	}
	for j, i := range ci {
		if vals[2*j] == 4 {
			out[i].Err = storeErr("claim", fmt.Errorf("%w: key %q holds another type", errNotRecord, keys[j]))
			continue
		}
		out[i].Claim, out[i].Err = claimResult(vals[2*j : 2*j+2])
	}
	for j, i := range di {
		switch vals[2*len(ci)+j] {
		case 1:
		case -1:
			done[i] = storeErr("complete", fmt.Errorf("%w: key %q holds another type", errNotRecord, keys[len(ci)+j]))
		default:
			done[i] = dedup.ErrLeaseLost
		}
	}
	return out, done
}

// batchPerKey answers a batch with one script per request (a Cluster
// client: the keys of a batch are in different slots). keys and args are
// those of the batch script, without its leading claim count.
func (s *RueidisStore) batchPerKey(ctx context.Context, keys, args []string, ci, di []int, out []dedup.ClaimReply, done []error) {
	claimExec := make([]rueidis.LuaExec, len(ci))
	for j := range ci {
		claimExec[j] = rueidis.LuaExec{Keys: keys[j : j+1], Args: args[2*j : 2*j+2]}
	}
	completeExec := make([]rueidis.LuaExec, len(di))
	for j := range di {
		k := len(ci) + j
		completeExec[j] = rueidis.LuaExec{Keys: keys[k : k+1], Args: args[2*k : 2*k+2]}
	}
	if len(ci) > 0 {
		for j, r := range rClaim.ExecMulti(ctx, s.client, claimExec...) {
			vals, err := r.AsIntSlice()
			if err != nil {
				out[ci[j]].Err = storeErr("claim", err)
				continue
			}
			out[ci[j]].Claim, out[ci[j]].Err = claimResult(vals)
		}
	}
	if len(di) > 0 {
		for j, r := range rComplete.ExecMulti(ctx, s.client, completeExec...) {
			n, err := r.AsInt64()
			switch {
			case err != nil:
				done[di[j]] = storeErr("complete", err)
			case n != 1:
				done[di[j]] = dedup.ErrLeaseLost
			}
		}
	}
}

// cas runs a compare-and-set script that returns 1 on success.
func (s *RueidisStore) cas(ctx context.Context, op string, script *rueidis.Lua, key, token string, d time.Duration) error {
	if err := s.prepare(ctx, op, key); err != nil {
		return err
	}
	args := []string{token}
	if d != 0 {
		args = append(args, msArg(d))
	}
	n, err := script.Exec(ctx, s.client, []string{s.RedisKey(key)}, args).AsInt64()
	if err != nil {
		return storeErr(op, err)
	}
	if n != 1 {
		return dedup.ErrLeaseLost
	}
	return nil
}

// Complete implements [dedup.Store].
func (s *RueidisStore) Complete(ctx context.Context, key, token string, window time.Duration) error {
	return s.cas(ctx, "complete", rComplete, key, token, max(window, time.Millisecond))
}

// Release implements [dedup.Store].
func (s *RueidisStore) Release(ctx context.Context, key, token string) error {
	return s.cas(ctx, "release", rRelease, key, token, 0)
}

// Extend implements [dedup.Store].
func (s *RueidisStore) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	return s.cas(ctx, "extend", rExtend, key, token, max(lease, time.Millisecond))
}

// readRecord runs a script that answers {} (absent) or first-values then
// a value and its PTTL, and returns those (skip: how many come first).
func (s *RueidisStore) readRecord(ctx context.Context, op string, script *rueidis.Lua, key string, skip int) ([]rueidis.RedisMessage, dedup.Record, bool, error) {
	if err := s.prepare(ctx, op, key); err != nil {
		return nil, dedup.Record{}, false, err
	}
	now := time.Now()
	msgs, err := script.Exec(ctx, s.client, []string{s.RedisKey(key)}, nil).ToArray()
	if err != nil {
		return nil, dedup.Record{}, false, storeErr(op, err)
	}
	if len(msgs) == 0 {
		return nil, dedup.Record{}, false, nil
	}
	if len(msgs) != skip+2 {
		return nil, dedup.Record{}, false, storeErr(op, fmt.Errorf("unexpected script reply of %d values", len(msgs)))
	}
	v, err := msgs[skip].ToString()
	if err != nil {
		return nil, dedup.Record{}, false, storeErr(op, err)
	}
	pttl, err := msgs[skip+1].AsInt64()
	if err != nil {
		return nil, dedup.Record{}, false, storeErr(op, err)
	}
	rec, err := record(s.RedisKey(key), key, v, pttl, now)
	if err != nil {
		return msgs, dedup.Record{}, false, storeErr(op, err)
	}
	return msgs, rec, true, nil
}

// Get implements [dedup.Inspector].
func (s *RueidisStore) Get(ctx context.Context, key string) (dedup.Record, bool, error) {
	_, rec, found, err := s.readRecord(ctx, "get", rGet, key, 0)
	return rec, found, err
}

// ForgetIdle implements [dedup.IdleForgetter], as [Store.ForgetIdle].
func (s *RueidisStore) ForgetIdle(ctx context.Context, key string) (dedup.Record, bool, error) {
	msgs, rec, found, err := s.readRecord(ctx, "forget", rForgetIdle, key, 1)
	if err != nil || !found {
		return rec, found, err
	}
	if deleted, _ := msgs[0].AsInt64(); deleted != 1 {
		return rec, true, fmt.Errorf("%w: %s is processing, owner %s", dedup.ErrLeaseHeld, key, rec.Owner)
	}
	return rec, true, nil
}

// Forget implements [dedup.Inspector].
func (s *RueidisStore) Forget(ctx context.Context, key string) error {
	if err := s.prepare(ctx, "forget", key); err != nil {
		return err
	}
	if err := s.client.Do(ctx, s.client.B().Del().Key(s.RedisKey(key)).Build()).Error(); err != nil {
		return storeErr("forget", err)
	}
	return nil
}
