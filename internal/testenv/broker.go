package testenv

import (
	"net/url"
	"os"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/idemqtest/fakemq"
)

// FakeURL is the broker URL in fake mode. Its host does not resolve, so a
// connection that does not go through [Dial] fails rather than reach a real
// broker by mistake: a test that passes in fake mode ran on the fake.
const FakeURL = "amqp://guest:guest@fakemq.invalid:5672/"

// Fake reports whether IDEMQ_TEST_BROKER=fake: the tests' broker is then a
// process-wide in-memory [fakemq.Broker] instead of RabbitMQ. [AMQPURL] is
// [FakeURL] (and IDEMQ_AMQP_URL is set to it, so configs that leave URL
// empty point at it too), [Dial] connects to the fake for that URL, and
// [RequireRealBroker] skips the tests that need what the fake does not
// model.
func Fake() bool { return os.Getenv("IDEMQ_TEST_BROKER") == "fake" }

var (
	fakeOnce   sync.Once
	fakeBroker *fakemq.Broker
)

func init() {
	if Fake() {
		// The library's own default (idemq.URLFromEnv) reads this.
		_ = os.Setenv("IDEMQ_AMQP_URL", FakeURL)
	}
}

// FakeBroker is the process-wide fake broker (started on first use), or
// nil outside fake mode.
func FakeBroker() *fakemq.Broker {
	if !Fake() {
		return nil
	}
	fakeOnce.Do(func() { fakeBroker = fakemq.New(fakemq.Config{}) })
	return fakeBroker
}

// Dial is what tests pass as ConsumerConfig.Dial and PublisherConfig.Dial
// (and use for their own connections). Outside fake mode it is
// amqp.DialConfig. In fake mode a URL whose host is FakeURL's goes to the
// fake broker; any other URL (a dead port, a proxy) is dialled for real.
func Dial(raw string, cfg amqp.Config) (*amqp.Connection, error) {
	if Fake() && isFakeURL(raw) {
		return FakeBroker().Dial(raw, cfg)
	}
	return amqp.DialConfig(raw, cfg)
}

func isFakeURL(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	f, _ := url.Parse(FakeURL)
	return u.Hostname() == f.Hostname()
}

// RequireRealBroker skips the test in fake mode, saying why: it needs what
// the fake does not model (a broker restart, the consumer timeout, queue
// length limits, users, TLS, a TCP proxy, a cluster, rabbitmqctl…). Outside
// fake mode it does nothing; the test then calls RequireAMQP as usual.
func RequireRealBroker(t testing.TB, why string) {
	t.Helper()
	if Fake() {
		t.Skipf("real RabbitMQ only (IDEMQ_TEST_BROKER=fake): %s", why)
	}
}
