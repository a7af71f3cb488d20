package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/dedup/storetest"
	"github.com/idemq/idemq/internal/redistest"
	"github.com/idemq/idemq/internal/testenv"
)

func TestConformance(t *testing.T) {
	for _, v := range []struct {
		name         string
		auto, perKey bool
	}{{"plain", false, false}, {"autopipeline", true, false}, {"per-key-batches", false, true}} {
		auto := v.auto
		t.Run(v.name, func(t *testing.T) {
			storetest.Run(t, storetest.Suite{
				New: func(t *testing.T) dedup.Store {
					c, prefix := testenv.Redis(t)
					st := redistest.Store(t, c, redisstore.Config{KeyPrefix: prefix + ":", AutoPipeline: auto})
					if v.perKey {
						st = redisstore.PerKeyBatches(st)
					}
					return st
				},
				Broken: func(t *testing.T) dedup.Store {
					// A client pointed at a port nobody listens on.
					c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)), MaxRetries: -1, DialTimeout: time.Second})
					t.Cleanup(func() { c.Close() })
					return redistest.Store(t, c, redisstore.Config{AutoPipeline: auto})
				},
				Features: storetest.Features{Batch: true, Parallel: true},
			})
		})
	}
}

func TestClosedClientIsAStoreError(t *testing.T) {
	c, prefix := testenv.Redis(t)
	opt := c.(*redis.Client).Options()
	closed := redis.NewClient(opt)
	closed.Close()
	st, err := redisstore.New(closed, redisstore.Config{KeyPrefix: prefix + ":"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Claim(context.Background(), "k", "t", time.Minute)
	var se *dedup.StoreError
	if !errors.As(err, &se) {
		t.Fatalf("Claim on a closed client: %v, want a *dedup.StoreError", err)
	}
}

// The record layout is what the package doc says, hash tag included, and
// the Inspector reads it back.
func TestKeyLayoutAndInspector(t *testing.T) {
	c, prefix := testenv.Redis(t)
	st, err := redisstore.New(c, redisstore.Config{KeyPrefix: prefix + ":"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := dedup.Key("idemq", "billing", "order-42")
	rk := prefix + ":{idemq:billing:order-42}"
	if got := st.RedisKey(key); got != rk {
		t.Fatalf("RedisKey = %q, want %q", got, rk)
	}
	if _, err := st.Claim(ctx, key, "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(ctx, rk).Val(); v != "p:tok" {
		t.Fatalf("processing value %q, want p:tok", v)
	}
	rec, ok, err := st.Get(ctx, key)
	if err != nil || !ok || rec.State != dedup.StateProcessing || rec.Owner != "tok" {
		t.Fatalf("Get = %+v %v %v", rec, ok, err)
	}
	if d := time.Until(rec.ExpiresAt); d <= 0 || d > time.Minute {
		t.Fatalf("lease expires in %v", d)
	}
	if err := st.Complete(ctx, key, "tok", time.Hour); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(ctx, rk).Val(); v != "d" {
		t.Fatalf("done value %q, want d", v)
	}
	if ttl := c.PTTL(ctx, rk).Val(); ttl <= 59*time.Minute || ttl > time.Hour {
		t.Fatalf("done TTL %v, want about the 1h window", ttl)
	}
	rec, ok, err = st.Get(ctx, key)
	if err != nil || !ok || rec.State != dedup.StateDone {
		t.Fatalf("Get after complete = %+v %v %v", rec, ok, err)
	}
	if err := st.Forget(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := st.Get(ctx, key); ok {
		t.Fatal("record still there after Forget")
	}
	// A foreign value under the key is reported, not taken for a record.
	c.Set(ctx, rk, "something else", time.Minute)
	if _, _, err := st.Get(ctx, key); err == nil {
		t.Fatal("Get of a foreign value: no error")
	}
}

// Claims keep working after the script cache is flushed (EVALSHA falls
// back to EVAL on NOSCRIPT). On a private server: the shared one's script
// cache belongs to everyone.
func TestScriptCacheFlush(t *testing.T) {
	r := testenv.StartPrivateRedis(t, false)
	c := r.Client()
	defer c.Close()
	st, err := redisstore.New(c, redisstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if cl, err := st.Claim(ctx, "warm", "t", time.Minute); err != nil || cl.Result != dedup.Acquired {
		t.Fatalf("Claim = %v, %v", cl.Result, err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if cl, err := st.Claim(ctx, "k", "t", time.Minute); err != nil || cl.Result != dedup.Acquired {
		t.Fatalf("Claim after SCRIPT FLUSH = %v, %v", cl.Result, err)
	}
}

// TestForgetIdle: ForgetIdle deletes a done record, never a live lease nor
// a value that is not a dedup record, and reports what it found.
func TestForgetIdle(t *testing.T) {
	c, prefix := testenv.Redis(t)
	s, err := redisstore.New(c, redisstore.Config{KeyPrefix: prefix + ":"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, found, err := s.ForgetIdle(ctx, "fi:absent"); err != nil || found {
		t.Fatalf("ForgetIdle absent = found %v, %v", found, err)
	}
	const k = "fi:k"
	if _, err := s.Claim(ctx, k, "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	rec, found, err := s.ForgetIdle(ctx, k)
	if !errors.Is(err, dedup.ErrLeaseHeld) || !found || rec.State != dedup.StateProcessing || rec.Owner != "tok" ||
		time.Until(rec.ExpiresAt) < 30*time.Second {
		t.Fatalf("ForgetIdle live lease = %+v, found %v, %v; want the lease and ErrLeaseHeld", rec, found, err)
	}
	if cl, err := s.Claim(ctx, k, "other", time.Minute); err != nil || cl.Result != dedup.InFlight {
		t.Fatalf("lease gone after a refused ForgetIdle: %v %v", cl, err)
	}
	if err := s.Complete(ctx, k, "tok", time.Hour); err != nil {
		t.Fatal(err)
	}
	rec, found, err = s.ForgetIdle(ctx, k)
	if err != nil || !found || rec.State != dedup.StateDone {
		t.Fatalf("ForgetIdle done = %+v, found %v, %v", rec, found, err)
	}
	if cl, err := s.Claim(ctx, k, "rerun", time.Minute); err != nil || cl.Result != dedup.Acquired {
		t.Fatalf("claim after ForgetIdle: %v %v", cl, err)
	}
	foreign := "fi:foreign"
	if err := c.Set(ctx, s.RedisKey(foreign), "not-a-record", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	var se *dedup.StoreError
	if _, _, err := s.ForgetIdle(ctx, foreign); !errors.As(err, &se) {
		t.Fatalf("ForgetIdle on a foreign value = %v, want a StoreError", err)
	}
	if n, _ := c.Exists(ctx, s.RedisKey(foreign)).Result(); n != 1 {
		t.Fatal("ForgetIdle deleted a value that is not a dedup record")
	}
}

// A key of a batch that holds another type (a hash someone wrote under a
// dedup key) fails its own request only: the other deliveries of the batch
// are claimed and completed (a batch is one script call on a single node,
// and a WRONGTYPE inside a script would fail all of it).
func TestBatchKeyOfAnotherTypeFailsOnlyItself(t *testing.T) {
	for _, v := range []struct {
		name   string
		perKey bool
	}{{"one-script", false}, {"per-key", true}} {
		t.Run(v.name, func(t *testing.T) {
			c, prefix := testenv.Redis(t)
			st := redistest.Store(t, c, redisstore.Config{KeyPrefix: prefix + ":"})
			if v.perKey {
				st = redisstore.PerKeyBatches(st)
			}
			ctx := context.Background()
			bad := dedup.Key("idemq", "g", "hash")
			if err := c.HSet(ctx, st.RedisKey(bad), "f", "v").Err(); err != nil {
				t.Fatal(err)
			}
			if cl, err := st.Claim(ctx, dedup.Key("idemq", "g", "mine"), "me", time.Minute); err != nil || cl.Result != dedup.Acquired {
				t.Fatalf("Claim = %v, %v", cl.Result, err)
			}
			claims := []dedup.ClaimRequest{
				{Key: dedup.Key("idemq", "g", "a"), Token: "me", Lease: time.Minute},
				{Key: bad, Token: "me", Lease: time.Minute},
				{Key: dedup.Key("idemq", "g", "b"), Token: "me", Lease: time.Minute},
			}
			completes := []dedup.CompleteRequest{
				{Key: bad, Token: "me", Window: time.Minute},
				{Key: dedup.Key("idemq", "g", "mine"), Token: "me", Window: time.Minute},
			}
			reps, errs := st.Batch(ctx, claims, completes)
			var se *dedup.StoreError
			if reps[0].Err != nil || reps[0].Claim.Result != dedup.Acquired || reps[2].Err != nil || reps[2].Claim.Result != dedup.Acquired {
				t.Errorf("claims beside the bad key: %+v, %+v, want acquired", reps[0], reps[2])
			}
			if !errors.As(reps[1].Err, &se) {
				t.Errorf("claim of the bad key: %+v, want a *dedup.StoreError", reps[1])
			}
			if !errors.As(errs[0], &se) {
				t.Errorf("complete of the bad key: %v, want a *dedup.StoreError", errs[0])
			}
			if errs[1] != nil {
				t.Errorf("complete beside the bad key: %v", errs[1])
			}
		})
	}
}

// New refuses a missing client and a negative setting.
func TestNewValidates(t *testing.T) {
	if _, err := redisstore.New(nil, redisstore.Config{}); !errors.Is(err, redisstore.ErrNoClient) {
		t.Fatalf("New(nil) = %v, want ErrNoClient", err)
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	if _, err := redisstore.New(c, redisstore.Config{WaitReplicas: -1}); err == nil {
		t.Fatal("New with WaitReplicas -1 succeeded")
	}
}
