package doctor_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/doctor"
	"github.com/idemq/idemq/internal/testenv"
)

// Why redis.maxmemory-policy exists, measured: done records written to a
// Redis with maxmemory and allkeys-lru, then other data until it evicts.
// Every evicted record is a message the guard lets run again (Acquired
// instead of Done): applied twice, silently. With noeviction the same
// filling is refused (OOM: the guard's own writes too, which the consumer
// takes as an outage and pauses) and every record stays Done.
func TestEvictionAppliesTwice(t *testing.T) {
	for _, tc := range []struct {
		policy string
		want   doctor.Status
	}{{"allkeys-lru", doctor.Fail}, {"noeviction", doctor.Pass}} {
		t.Run(tc.policy, func(t *testing.T) {
			ctx := context.Background()
			rs := testenv.StartPrivateRedis(t, false)
			c := rs.Client()
			defer c.Close()
			for k, v := range map[string]string{"maxmemory": "8mb", "maxmemory-policy": tc.policy} {
				if err := c.ConfigSet(ctx, k, v).Err(); err != nil {
					t.Fatal(err)
				}
			}
			requireOne(t, run(t, doctor.Config{Redis: c}), "redis.maxmemory-policy", "", tc.want)

			store, err := redisstore.New(c, redisstore.Config{})
			if err != nil {
				t.Fatal(err)
			}
			const n = 2000
			key := func(i int) string { return dedup.Key("idemq", "evict", "m-"+strconv.Itoa(i)) }
			for i := 0; i < n; i++ {
				if _, err := store.Claim(ctx, key(i), "t", time.Minute); err != nil {
					t.Fatal(err)
				}
				if err := store.Complete(ctx, key(i), "t", time.Hour); err != nil {
					t.Fatal(err)
				}
			}
			// Other data: 16 MiB in 1 KiB values, twice the limit.
			filler := strings.Repeat("x", 1024)
			refused := 0
			for i := 0; i < 16*1024; i++ {
				if err := c.Set(ctx, "filler:"+strconv.Itoa(i), filler, 0).Err(); err != nil {
					if !strings.HasPrefix(err.Error(), "OOM") {
						t.Fatal(err)
					}
					refused++
				}
			}
			evicted := infoInt(t, c, "evicted_keys")
			// The other data goes away again: what is left of the records
			// is what the redeliveries below find.
			pipe := c.Pipeline()
			for i := 0; i < 16*1024; i++ {
				pipe.Del(ctx, "filler:"+strconv.Itoa(i))
			}
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}

			twice := 0
			for i := 0; i < n; i++ {
				cl, err := store.Claim(ctx, key(i), "again", time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				if cl.Result == dedup.Acquired {
					twice++
				}
			}
			t.Logf("%s, maxmemory 8mb: %d done records, then 16 MiB of other data (%d writes refused): %d keys evicted; %d of %d redelivered messages would run again",
				tc.policy, n, refused, evicted, twice, n)
			switch tc.policy {
			case "noeviction":
				if twice != 0 || evicted != 0 || refused == 0 {
					t.Fatalf("noeviction: %d would run again, %d evicted, %d refused; want 0, 0, >0", twice, evicted, refused)
				}
			default:
				if evicted == 0 || twice == 0 {
					t.Fatalf("%s: %d evicted, %d would run again; want both > 0 (the filling did not reach the limit)", tc.policy, evicted, twice)
				}
			}
		})
	}
}

func infoInt(t *testing.T, c *redis.Client, field string) int {
	t.Helper()
	info, err := c.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal(fmt.Sprintf("INFO stats has no %s", field))
	return 0
}
