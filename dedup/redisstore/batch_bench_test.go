package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/testenv"
)

// BenchmarkBatch measures one grouped round trip as the guard sends it
// under load: 16 claims of new deliveries and the 16 completes of the
// previous batch's, in one call. ns/op and allocs/op are per batch of 32
// requests (the client's cost; Redis' shows in INFO commandstats).
//
//	go test -run '^$' -bench 'Batch$' -benchmem -count 3 ./dedup/redisstore
func BenchmarkBatch(b *testing.B) {
	c, prefix := testenv.Redis(b)
	st, err := redisstore.New(c, redisstore.Config{KeyPrefix: prefix + ":"})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	const n = 16
	claims := make([]dedup.ClaimRequest, n)
	completes := make([]dedup.CompleteRequest, n)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for j := range claims {
			id := strconv.Itoa(i*n + j)
			claims[j] = dedup.ClaimRequest{Key: "k" + id, Token: "t" + id, Lease: 30 * time.Second}
		}
		rs, errs := st.Batch(ctx, claims, completes[:min(i, 1)*n])
		for j, r := range rs {
			if r.Err != nil || r.Claim.Result != dedup.Acquired {
				b.Fatalf("claim %d: %+v", j, r)
			}
			completes[j] = dedup.CompleteRequest{Key: claims[j].Key, Token: claims[j].Token, Window: time.Hour}
		}
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
}
