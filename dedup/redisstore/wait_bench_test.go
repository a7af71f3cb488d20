package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/testenv"
)

// BenchmarkCompleteWait measures claim+complete through Sentinel without
// and with WAIT 1 (Config.WaitReplicas), one call after the other (the
// latency a handler sees). It uses `make cluster`'s Redis when
// IDEMQ_REDIS_SENTINELS is set, else a private one.
//
//	go test -run '^$' -bench CompleteWait -benchtime 3000x -count 3 ./dedup/redisstore
func BenchmarkCompleteWait(b *testing.B) {
	var rdb *redis.Client
	if s := os.Getenv("IDEMQ_REDIS_SENTINELS"); s != "" {
		rdb = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: envOrDefault("IDEMQ_REDIS_MASTER", "idemq"), SentinelAddrs: strings.Split(s, ",")})
		b.Cleanup(func() { rdb.Close() })
	} else {
		rdb = testenv.StartCluster(b, testenv.ClusterConfig{Redis: true}).FailoverClient()
	}
	ctx := context.Background()
	for _, wait := range []int{0, 1} {
		b.Run(fmt.Sprintf("wait=%d/single", wait), func(b *testing.B) {
			st, err := redisstore.New(rdb, redisstore.Config{KeyPrefix: testenv.Name(b, "bw") + ":", WaitReplicas: wait})
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				key := fmt.Sprint("k", i)
				if _, err := st.Claim(ctx, key, "t", time.Minute); err != nil {
					b.Fatal(err)
				}
				if err := st.Complete(ctx, key, "t", time.Hour); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(st.WaitShortfalls()), "shortfalls")
		})
	}
}

func envOrDefault(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
