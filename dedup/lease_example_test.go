package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
)

// A handler that must never apply its effect after another consumer took
// the message over checks its lease last thing before it commits, inside
// its transaction: Check asks the store whether the lease is still this
// delivery's (and renews it). When it is not, the handler rolls back and
// returns the error; the guard gives the delivery back, and its next claim
// finds it done, deferred, or free to run.
//
// The handler's context is cancelled too, with idemq.ErrLeaseLost as its
// cause, as soon as the guard learns the lease is lost; Check closes the
// gap between that and the commit.
func ExampleLeaseFrom() {
	store := dedup.NewMemory(dedup.MemoryConfig{})
	takeover := false // simulate another consumer taking the message over
	guard, err := dedup.NewGuard(dedup.Config{Store: store})
	if err != nil {
		panic(err)
	}
	handler := guard.Wrap(idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		lease, _ := dedup.LeaseFrom(ctx)
		// The transaction runs on a context the lease loss cannot cancel:
		// a COMMIT in flight when the lease is lost must report what the
		// database did, not "context canceled" (the guard would give the
		// delivery back and it would be applied again).
		//   tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		//   defer cancel()
		//   tx, err := db.BeginTx(tctx, nil)
		// ... the effect, in tx ...
		if takeover {
			_ = store.Forget(ctx, lease.Key())
			_, _ = store.Claim(ctx, lease.Key(), "another-consumer", time.Minute)
		}
		if err := lease.Check(ctx); err != nil {
			// tx.Rollback()
			fmt.Println("rolled back:", errors.Is(err, idemq.ErrLeaseLost), errors.Is(context.Cause(ctx), idemq.ErrLeaseLost))
			return err
		}
		// return tx.Commit()
		fmt.Println("committed under", lease.Key())
		return nil
	}))

	d := &idemq.Delivery{MessageID: "order-42", Queue: "orders", Group: "billing"}
	fmt.Println(handler.Handle(context.Background(), d))

	takeover = true
	d = &idemq.Delivery{MessageID: "order-43", Queue: "orders", Group: "billing"}
	err = handler.Handle(context.Background(), d)
	var rq *idemq.RequeueError
	fmt.Println(errors.As(err, &rq) && rq.Reason == dedup.RequeueLeaseLost)
	// Output:
	// committed under idemq:billing:order-42
	// <nil>
	// rolled back: true true
	// true
}
