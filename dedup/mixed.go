package dedup

import (
	"context"
	"errors"

	"github.com/idemq/idemq/internal/coalesce"
)

// errShortBatch answers a request a MixedBatchStore's Batch left out.
var errShortBatch = errors.New("dedup: the store's batch answered fewer requests than it was given")

// mixedReq is a claim, or (complete set) a complete, in a batch of a
// MixedBatchStore.
type mixedReq struct {
	complete bool
	claim    ClaimRequest
	done     CompleteRequest
}

// mixedReply answers a mixedReq: claim for a claim, err for a complete.
type mixedReply struct {
	claim ClaimReply
	err   error
}

// newMixedBatcher groups the guard's claims and completes into shared
// calls of ms.Batch.
func newMixedBatcher(ms MixedBatchStore, cfg Config) *coalesce.Batcher[mixedReq, mixedReply] {
	fn := func(ctx context.Context, reqs []mixedReq) []mixedReply {
		var claims []ClaimRequest
		var completes []CompleteRequest
		for _, r := range reqs {
			if r.complete {
				completes = append(completes, r.done)
			} else {
				claims = append(claims, r.claim)
			}
		}
		cr, er := ms.Batch(ctx, claims, completes)
		out := make([]mixedReply, len(reqs))
		ci, ei := 0, 0
		for i, r := range reqs {
			if r.complete {
				if ei < len(er) {
					out[i].err = er[ei]
				} else {
					out[i].err = &StoreError{Op: "complete", Err: errShortBatch}
				}
				ei++
				continue
			}
			if ci < len(cr) {
				out[i].claim = cr[ci]
			} else {
				out[i].claim = ClaimReply{Err: &StoreError{Op: "claim", Err: errShortBatch}}
			}
			ci++
		}
		return out
	}
	fail := func(err error) mixedReply {
		return mixedReply{claim: ClaimReply{Err: &StoreError{Op: "claim", Err: err}}, err: &StoreError{Op: "complete", Err: err}}
	}
	return coalesce.New(fn, fail, coalesce.Config{MaxBatch: cfg.MaxBatch, MaxInFlight: cfg.BatchesInFlight, Timeout: cfg.StoreTimeout})
}
