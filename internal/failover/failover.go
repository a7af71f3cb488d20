package failover

import (
	"math/rand/v2"
	"strings"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/redact"
)

// Brokers is the list of broker URLs a consumer or a publisher connects
// to: one URL for a single broker, one per node for a cluster
// (idemq.ConsumerConfig.URLs, idemq.PublisherConfig.URLs).
//
// Each (re)connect is one pass over the list in a fresh random order (so
// that many clients restarting at once spread over the nodes), with the
// URL of the connection that just ended moved to the end of the pass: its
// node is the one most likely down. The first URL that dials wins; the pass
// fails only when every URL failed, and its error names each URL tried
// (redacted) with its cause. The caller's backoff runs between passes, not
// between the URLs of one pass: a dead node on the way costs a refused
// connection, not a backoff step.
type Brokers struct {
	urls []string

	mu   sync.Mutex
	last string // URL of the latest successful dial
}

// New merges url and urls (url first, duplicates and empty entries
// dropped). The list may be empty only if both are; callers fill a default
// before.
func New(url string, urls []string) *Brokers {
	b := &Brokers{}
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
func (b *Brokers) order() []string {
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

// Dial connects to the first URL of a pass that answers (see [Brokers]),
// with dial (a Config.Dial; see dialRedacted). It returns the
// connection and the redacted URL it went to. When every URL of a pass
// with more than one failed, the error is an [*AllFailed].
func (b *Brokers) Dial(dial func(string, amqp.Config) (*amqp.Connection, error), cfg amqp.Config) (*amqp.Connection, string, error) {
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
	return nil, "", &AllFailed{Errs: errs}
}

// AllFailed is a pass over a list of brokers in which every dial failed;
// each error names its (redacted) URL.
type AllFailed struct{ Errs []error }

func (e *AllFailed) Error() string {
	parts := make([]string, len(e.Errs))
	for i, err := range e.Errs {
		parts[i] = err.Error()
	}
	return "no broker reachable (" + strings.Join(parts, "; ") + ")"
}

// Unwrap returns the error of each dial.
func (e *AllFailed) Unwrap() []error { return e.Errs }
