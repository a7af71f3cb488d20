package idemq

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/mgmt"
)

// readDeliveryLimit reads the delivery limit the broker applies to the
// queue from the management API (ConsumerConfig.ManagementURL), at every
// (re)connect: a policy may have changed, and after a failover another
// node answers. Before the first subscription a failure is the session's
// error (Run retries it, or ends with a *StartupError when it is
// permanent); after it, the last limit read stays in use, with a warning.
func (c *Consumer) readDeliveryLimit(ctx context.Context, conn *amqp.Connection) error {
	if c.mgmt == nil {
		return nil
	}
	return c.readLimit(ctx, vhostOf(conn))
}

func vhostOf(conn *amqp.Connection) string {
	if conn.Config.Vhost == "" {
		return "/"
	}
	return conn.Config.Vhost
}

// refreshDeliveryLimit reads the limit again every ManagementRefresh
// until ctx ends (the session's end), so a policy changed while the
// consumer runs counts without a reconnect.
func (c *Consumer) refreshDeliveryLimit(ctx context.Context, conn *amqp.Connection) {
	if c.mgmt == nil || c.cfg.ManagementRefresh <= 0 {
		return
	}
	vhost := vhostOf(conn)
	t := time.NewTicker(c.cfg.ManagementRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = c.readLimit(ctx, vhost) // after the first read: never an error, a warning
		}
	}
}

// readLimit reads the limit of the queue in vhost (see readDeliveryLimit).
func (c *Consumer) readLimit(ctx context.Context, vhost string) error {
	c.limitMu.Lock()
	defer c.limitMu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, c.cfg.ManagementTimeout)
	defer cancel()
	q, err := c.mgmt.Queue(rctx, vhost, c.cfg.Queue)
	var l mgmt.Limit
	if err == nil {
		if l, err = mgmt.Resolve(q); err != nil {
			err = fmt.Errorf("queue %q in vhost %q at %s: %w", c.cfg.Queue, vhost, c.mgmt, err)
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !c.readyOnce() || !c.limitRead {
			return fmt.Errorf("read the delivery limit of queue %q (ConsumerConfig.ManagementURL): %w", c.cfg.Queue, err)
		}
		c.log.Warn("idemq: could not read the queue's delivery limit; keeping the last one read",
			"limit", c.queueLimit.Load(), "management", c.mgmt.String(), "err", err)
		return nil
	}
	n := int64(0)
	if l.Source != mgmt.SourceNone {
		n = int64(max(l.N, 1)) // a limit of 0: no requeue is safe; 1 says the same to the policy
	}
	old := c.queueLimit.Swap(n)
	if !c.limitRead || old != n {
		c.log.Info("idemq: queue delivery limit", "limit", l.String(), "source", l.Source, "policy", l.Name,
			"type", l.Type, "vhost", vhost, "management", c.mgmt.String())
	}
	c.limitRead = true
	c.readConsumerTimeout(q)
	return nil
}

// readConsumerTimeout takes the consumer timeout the broker shows for the
// queue (an x-consumer-timeout argument, a consumer-timeout policy) as
// the bound of handlers when it is shorter than ConsumerTimeout, and
// warns once per value when it is shorter than HandlerTimeout or
// ConsumerTimeout: handlers end before the broker would close the
// channel. Called with limitMu held.
func (c *Consumer) readConsumerTimeout(q mgmt.Queue) {
	d, source, ok, err := mgmt.ConsumerTimeout(q)
	if err != nil {
		c.log.Warn("idemq: could not read the queue's consumer timeout", "queue", c.cfg.Queue, "err", err)
		return
	}
	n := int64(0)
	if ok && d > 0 {
		n = int64(d)
	}
	if c.queueTimeout.Swap(n) == n {
		return
	}
	c.watch.SetTimeouts(c.timeouts())
	if n == 0 {
		return
	}
	if (c.cfg.ConsumerTimeout > 0 && d < c.cfg.ConsumerTimeout) || c.cfg.HandlerTimeout > d {
		c.log.Warn("idemq: the broker applies a shorter consumer timeout to the queue than the consumer was given; handlers are bounded below it",
			"queue", c.cfg.Queue, "consumer_timeout", d, "source", source,
			"ConsumerTimeout", c.cfg.ConsumerTimeout, "HandlerTimeout", c.cfg.HandlerTimeout, "bound", d-c.timeouts().Margin)
		return
	}
	c.log.Info("idemq: queue consumer timeout", "queue", c.cfg.Queue, "consumer_timeout", d, "source", source)
}
