package retry

import (
	"context"
	"errors"
	"time"

	"github.com/idemq/idemq"
)

// UnavailableRetryAfter is how long a delivery whose dependency was
// unavailable waits before it is given back, when the error does not say
// (an idemq.RequeueError's After).
const UnavailableRetryAfter = time.Second

// RequeueUnavailable is the Reason of the requeue the policy returns for a
// dependency outage.
const RequeueUnavailable = "dependency-unavailable"

// unavailable handles a delivery whose handler chain failed because a
// dependency (the database, the dedup store) could not be reached
// (idemq.IsUnavailable). That is not the message's fault: no quick retry,
// no delay-queue hop with attempt+1, no dead letter. The delivery is given
// back in place (the consumer nacks it with requeue after a delay; its
// x-idemq-attempt is unchanged), and the error stays an
// idemq.UnavailableError so the consumer's breaker sees the outage. A
// quorum delivery count past half the DeliveryLimit is reset by
// republishing to the work queue itself (see requeue).
func (p *policy) unavailable(ctx context.Context, d *idemq.Delivery, err error) error {
	after := UnavailableRetryAfter
	var rq *idemq.RequeueError
	if errors.As(err, &rq) && rq.After > 0 {
		after = rq.After
	}
	p.cfg.Logger.Debug("idemq/retry: dependency unavailable; delivery given back, not counted as an attempt",
		"message_id", d.MessageID, "after", after, "err", err)
	back := idemq.RequeueInPlace(after, RequeueUnavailable, err)
	return p.requeue(ctx, d, back.(*idemq.RequeueError), back)
}
