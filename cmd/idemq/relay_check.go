package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// errBrokerRefused is a broker check that retrying cannot fix: wrong
// credentials, a vhost the user may not use, a URL that does not parse.
var errBrokerRefused = errors.New("broker check failed")

// checkBroker connects to the broker once before the relay starts, so a
// wrong password or vhost ends the command at once with the broker's
// reason instead of surfacing as publish timeouts. A broker that does not
// answer (down, restarting) is only logged at WARN: the relay's publisher
// retries until it is back.
func checkBroker(ctx context.Context, log *slog.Logger, amqpU string, timeout time.Duration) error {
	if _, err := amqp.ParseURI(amqpU); err != nil {
		return fmt.Errorf("%w: --amqp %s: not an AMQP URL (amqp[s]://user:password@host:port/vhost)", errBrokerRefused, redactURL(amqpU))
	}
	type result struct {
		conn *amqp.Connection
		err  error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := amqp.DialConfig(amqpU, amqp.Config{Dial: amqp.DefaultDial(timeout), Locale: "en_US",
			Properties: amqp.Table{"connection_name": "idemq relay (broker check)"}})
		done <- result{conn, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if r.err == nil {
		_ = r.conn.Close()
		return nil
	}
	var ae *amqp.Error
	if errors.As(r.err, &ae) && (ae.Code == amqp.AccessRefused || ae.Code == amqp.NotAllowed) {
		return fmt.Errorf("%w: %s refused the connection (AMQP %d %s): check the user, password and vhost of --amqp",
			errBrokerRefused, redactURL(amqpU), ae.Code, ae.Reason)
	}
	log.Warn("idemq relay: broker not reachable at start; publishing will retry until it is", "amqp", redactURL(amqpU), "err", r.err)
	return nil
}
