// Package backoff is idemq's one backoff type: capped exponential delays
// with equal jitter ([Policy]) and a context-aware [Sleep]. The consumer
// (reconnects), the publisher (resends), the breaker (probes), the retry
// policy (quick attempts) and the outbox relay all take a [Policy], so a
// user configures every wait the same way.
package backoff
