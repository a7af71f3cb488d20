package idemq

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// vhostOf is the vhost conn is open on.
func vhostOf(conn *amqp.Connection) string {
	if conn.Config.Vhost == "" {
		return "/"
	}
	return conn.Config.Vhost
}

// queueTimeoutRead hears the consumer timeout the broker shows for the
// queue (an x-consumer-timeout argument, a consumer-timeout policy; 0:
// none), read with its delivery limit: when it is shorter than
// ConsumerTimeout it bounds the handlers and the watchdog from now on
// (timeouts), and it is warned about once per value when it is shorter
// than HandlerTimeout or ConsumerTimeout.
func (c *Consumer) queueTimeoutRead(d time.Duration, source string) {
	c.watch.SetTimeouts(c.timeouts())
	if d == 0 {
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
