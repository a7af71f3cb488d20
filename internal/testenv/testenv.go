package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Env var names and their loopback defaults.
const (
	DefaultAMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
	DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	DefaultMySQLURL    = "idemq:idemq@tcp(127.0.0.1:3306)/"
)

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// AMQPURL is IDEMQ_AMQP_URL or the loopback default; [FakeURL] in fake
// mode (see [Fake]).
func AMQPURL() string {
	if Fake() {
		return FakeURL
	}
	return env("IDEMQ_AMQP_URL", DefaultAMQPURL)
}

// RedisURL is IDEMQ_REDIS_URL or the loopback default.
func RedisURL() string { return env("IDEMQ_REDIS_URL", DefaultRedisURL) }

// PostgresURL is IDEMQ_POSTGRES_URL or the loopback default.
func PostgresURL() string { return env("IDEMQ_POSTGRES_URL", DefaultPostgresURL) }

// MySQLURL is IDEMQ_MYSQL_URL (a go-sql-driver DSN without a database) or the
// loopback default.
func MySQLURL() string { return env("IDEMQ_MYSQL_URL", DefaultMySQLURL) }

// RabbitNode is the node name rabbitmqctl talks to.
func RabbitNode() string { return env("IDEMQ_RABBITMQ_NODE", "rabbit@localhost") }

// InCI reports whether CI=true: missing services are then failures, not skips.
func InCI() bool { return os.Getenv("CI") == "true" }

// Unavailable fails the test in CI and skips it elsewhere, with a message
// saying how to start the service.
func Unavailable(t testing.TB, service, url string, err error) {
	t.Helper()
	msg := fmt.Sprintf("%s is not reachable at %s (%v): start the services with `make services` (and `eval $(make -s env)` for non-default ports)", service, Redact(url), err)
	if InCI() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// RequireAMQP checks the broker is up and returns its URL (in fake mode,
// the fake's: connect to it with [Dial]).
func RequireAMQP(t testing.TB) string {
	t.Helper()
	u := AMQPURL()
	err := Reachable(ReachWithin, func() error {
		conn, err := Dial(u, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err == nil {
			conn.Close()
		}
		return err
	})
	if err != nil {
		Unavailable(t, "RabbitMQ", u, err)
	}
	return u
}

// ReachWithin is how long [Reachable] keeps trying a service that answers
// slowly: on a loaded 2-core machine (a whole test suite in parallel) a
// broker has taken more than 3 s to complete an AMQP handshake.
const ReachWithin = 30 * time.Second

// Reachable runs try until it succeeds, it fails with a refused
// connection (nothing listens: no retry, so a missing service fails at
// once), or within has passed; it returns try's last error.
func Reachable(within time.Duration, try func() error) error {
	deadline := time.Now().Add(within)
	for pause := 100 * time.Millisecond; ; pause = min(2*pause, 2*time.Second) {
		err := try()
		if err == nil || errors.Is(err, syscall.ECONNREFUSED) || time.Now().Add(pause).After(deadline) {
			return err
		}
		time.Sleep(pause)
	}
}

// Redact hides the password in a URL.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// Name returns a name unique to this test run: prefix, the sanitised test
// name and a random suffix. Use it for queues, key prefixes and databases.
func Name(t testing.TB, prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	n := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			return r
		case r >= 'A' && r <= 'Z':
			return r + ('a' - 'A')
		}
		return '_'
	}, t.Name())
	if len(n) > 40 {
		n = n[:40]
	}
	return prefix + "_" + n + "_" + hex.EncodeToString(b[:])
}

// Channel opens a connection and channel for test plumbing, closed at cleanup.
func Channel(t testing.TB) *amqp.Channel {
	t.Helper()
	u := RequireAMQP(t)
	conn, err := Dial(u, amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US"})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	return ch
}

// Queue declares a durable classic queue named for the test, deleted at
// cleanup, and returns its name.
func Queue(t testing.TB, args amqp.Table) string {
	t.Helper()
	name := Name(t, "q")
	ch := Channel(t)
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		t.Fatalf("declare %s: %v", name, err)
	}
	t.Cleanup(func() { DeleteQueue(name) })
	return name
}

// DeleteQueue deletes a queue on a fresh connection, ignoring errors.
func DeleteQueue(names ...string) {
	conn, err := Dial(AMQPURL(), amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US"})
	if err != nil {
		return
	}
	defer conn.Close()
	for _, n := range names {
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		_, _ = ch.QueueDelete(n, false, false, false)
		_ = ch.Close()
	}
}

// QueueCounts returns (ready, consumers) for a queue via a passive declare.
// The broker's count of ready messages excludes unacked ones.
func QueueCounts(t testing.TB, name string) (int, int) {
	t.Helper()
	ch := Channel(t)
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspect %s: %v", name, err)
	}
	return q.Messages, q.Consumers
}

// Publish sends persistent messages with confirms (raw amqp091, for tests).
func Publish(t testing.TB, exchange, key string, msgs ...amqp.Publishing) {
	t.Helper()
	ch := Channel(t)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dcs := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for _, m := range msgs {
		if m.DeliveryMode == 0 {
			m.DeliveryMode = amqp.Persistent
		}
		dc, err := ch.PublishWithDeferredConfirm(exchange, key, false, false, m)
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		dcs = append(dcs, dc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, dc := range dcs {
		ok, err := dc.WaitContext(ctx)
		if err != nil || !ok {
			t.Fatalf("confirm: ok=%v err=%v", ok, err)
		}
	}
}

// Drain takes every ready message from a queue with basic.get and acks it.
func Drain(t testing.TB, queue string) []amqp.Delivery {
	t.Helper()
	ch := Channel(t)
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			t.Fatalf("get %s: %v", queue, err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
}

// Eventually polls cond every 10ms until it is true or the deadline passes.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Rabbitmqctl runs rabbitmqctl against the test node.
func Rabbitmqctl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"-q", "-n", RabbitNode()}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// FreePort returns a free loopback TCP port.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
