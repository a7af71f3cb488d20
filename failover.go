package idemq

import (
	"errors"
	"math/rand/v2"
	"strings"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/redact"
)

// brokers is the list of broker URLs a consumer or a publisher connects to:
// one URL for a single broker, one per node for a cluster
// ([ConsumerConfig.URLs], [PublisherConfig.URLs]).
//
// Each (re)connect is one pass over the list in a fresh random order (so
// that many clients restarting at once spread over the nodes), with the
// URL of the connection that just ended moved to the end of the pass: its
// node is the one most likely down. The first URL that dials wins; the pass
// fails only when every URL failed, and its error names each URL tried
// (redacted) with its cause. The caller's backoff runs between passes, not
// between the URLs of one pass: a dead node on the way costs a refused
// connection, not a backoff step.
type brokers struct {
	urls []string

	mu   sync.Mutex
	last string // URL of the latest successful dial
}

// newBrokers merges url and urls (url first, duplicates and empty entries
// dropped). The list may be empty only if both are; callers fill a default
// before.
func newBrokers(url string, urls []string) *brokers {
	b := &brokers{}
	seen := map[string]bool{}
	for _, u := range append([]string{url}, urls...) {
		u = strings.TrimSpace(u)
		if u == "" || seen[u] {
			continue
		}
		seen[u] = true
		b.urls = append(b.urls, u)
	}
	return b
}

// order is the order of one dial pass: shuffled, the last URL connected to
// at the end.
func (b *brokers) order() []string {
	out := append([]string(nil), b.urls...)
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	b.mu.Lock()
	last := b.last
	b.mu.Unlock()
	if len(out) > 1 && last != "" {
		for i, u := range out {
			if u == last {
				out = append(append(out[:i:i], out[i+1:]...), u)
				break
			}
		}
	}
	return out
}

// dial connects to the first URL of a pass that answers (see [brokers]).
// It returns the connection and the redacted URL it went to.
func (b *brokers) dial(dial func(string, amqp.Config) (*amqp.Connection, error), cfg amqp.Config) (*amqp.Connection, string, error) {
	var errs []error
	for _, u := range b.order() {
		conn, err := dialRedacted(dial, u, cfg)
		if err == nil {
			b.mu.Lock()
			b.last = u
			b.mu.Unlock()
			return conn, redact.URL(u), nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 1 {
		return nil, "", errs[0]
	}
	return nil, "", &allDialsFailed{errs: errs}
}

// allDialsFailed is a pass over a list of brokers in which every dial
// failed; each error names its (redacted) URL.
type allDialsFailed struct{ errs []error }

func (e *allDialsFailed) Error() string {
	parts := make([]string, len(e.errs))
	for i, err := range e.errs {
		parts[i] = err.Error()
	}
	return "no broker reachable (" + strings.Join(parts, "; ") + ")"
}

func (e *allDialsFailed) Unwrap() []error { return e.errs }

// errChannelRetired fails the publishes still awaiting a confirm on a
// channel the publisher retired after a nack; they are retried on a new
// one.
var errChannelRetired = errors.New("idemq: channel retired after a nack")

// retire drops a channel that nacked a publish, and its connection: the
// next attempt opens new ones. RabbitMQ 3.10 nacks every publish, for as
// long as the channel lives, on a channel that was publishing to a quorum
// queue whose leader node died, while a new channel publishes at once
// (TestFaultClusterLeaderKill saw minutes of nacks after the kill). A nack
// is rare otherwise (an internal error, a reject-publish overflow), so a
// new connection for it costs little; the backoff between attempts still
// applies.
func (p *Publisher) retire(pc *pubChannel) {
	p.mu.Lock()
	if p.cur == pc {
		p.cur = nil
		p.rec.Add(CountReconnects, 1)
	}
	p.mu.Unlock()
	_ = pc.conn.Close()
	pc.fail(errChannelRetired)
}
