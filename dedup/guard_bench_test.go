package dedup_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
)

// BenchmarkGuard measures the guard's own cost per delivery (claim, lease,
// complete) on the in-memory store, with concurrent workers as in a
// consumer: ns/op and allocs/op are the guard's, not a store's.
func BenchmarkGuard(b *testing.B) {
	for _, c := range []struct {
		name     string
		maxBatch int
	}{{"memory", 0}, {"memory-grouped", 128}} {
		b.Run(c.name, func(b *testing.B) {
			var st dedup.Store = dedup.NewMemory(dedup.MemoryConfig{})
			if c.maxBatch > 0 {
				st = instantMixed{st.(*dedup.Memory)}
			}
			g, err := dedup.NewGuard(dedup.Config{Store: st, Prefix: "bench", Lease: 30 * time.Second, Window: time.Hour, MaxBatch: c.maxBatch})
			if err != nil {
				b.Fatal(err)
			}
			h := g.Wrap(idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil }))
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(16)
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					d := &idemq.Delivery{MessageID: "m-" + strconv.FormatInt(n.Add(1), 10), Queue: "q", Group: "g"}
					if err := h.Handle(ctx, d); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// instantMixed is the memory store answering batches call by call (no
// round trip), so the guard takes its grouped path, the Redis store's,
// without a server.
type instantMixed struct{ *dedup.Memory }

func (m instantMixed) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) []dedup.ClaimReply {
	out := make([]dedup.ClaimReply, len(reqs))
	for i, r := range reqs {
		out[i].Claim, out[i].Err = m.Claim(ctx, r.Key, r.Token, r.Lease)
	}
	return out
}

func (m instantMixed) CompleteBatch(ctx context.Context, reqs []dedup.CompleteRequest) []error {
	out := make([]error, len(reqs))
	for i, r := range reqs {
		out[i] = m.Complete(ctx, r.Key, r.Token, r.Window)
	}
	return out
}

func (m instantMixed) Batch(ctx context.Context, claims []dedup.ClaimRequest, completes []dedup.CompleteRequest) ([]dedup.ClaimReply, []error) {
	return m.ClaimBatch(ctx, claims), m.CompleteBatch(ctx, completes)
}
