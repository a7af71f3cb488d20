package breaker

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Deciding an outage by asking the dependency.
//
// A failed run whose error does not say what it is (Config.Askable) may
// still be an outage in a shape nobody listed: a server-side refusal
// (PostgreSQL 55000 / 57P03 / 53300, Redis LOADING or READONLY, MariaDB
// 1040), a proxy's error, a stall that ends in a deadline. Before the
// failure policy counts it as an attempt, the consumer asks the
// dependencies themselves: it runs the breaker's probes with a short
// deadline (AskTimeout). A probe that fails or does not answer in time
// makes the failure an outage (Config.Outage): the breaker opens, the
// delivery goes back uncounted. Probes that pass leave it the message's
// own failure. Concurrent failures share one probe run, and its answer is
// reused for AskReuse.

// askState shares one probe run between concurrent failed runs.
type askState struct {
	mu      sync.Mutex
	running chan struct{} // closed when the current run ends
	at      time.Time     // when the last answer came
	err     error         // the last answer (nil: every probe passed)
}

// Ask returns err, or err as an outage (Config.Outage) when the probes
// say a dependency is down. ctx is the worker's context: a run that ended
// because the consumer stops is not asked about.
func (b *Breaker) Ask(ctx context.Context, err error) error {
	if err == nil || b.cfg.Disabled || len(b.cfg.Probes) == 0 || b.cfg.AskTimeout < 0 ||
		b.cfg.Askable == nil || !b.cfg.Askable(err) {
		return err
	}
	if ctx.Err() != nil {
		// The worker's context (not the handler's deadline): the consumer
		// stops or its channel is gone, not the dependency's question.
		return err
	}
	perr := b.AskProbes()
	if perr == nil {
		return err
	}
	return b.cfg.Outage(err, perr)
}

// AskProbes runs the probes once for every caller waiting at the same
// time, and reuses an answer younger than AskReuse. nil: every probe
// passed within AskTimeout.
func (b *Breaker) AskProbes() error {
	a := &b.asked
	a.mu.Lock()
	if !a.at.IsZero() && time.Since(a.at) < b.cfg.AskReuse {
		err := a.err
		a.mu.Unlock()
		return err
	}
	if wait := a.running; wait != nil {
		a.mu.Unlock()
		<-wait
		a.mu.Lock()
		err := a.err
		a.mu.Unlock()
		return err
	}
	done := make(chan struct{})
	a.running = done
	a.mu.Unlock()

	var err error
	defer func() {
		a.mu.Lock()
		a.err, a.at, a.running = err, time.Now(), nil
		a.mu.Unlock()
		close(done)
	}()
	// Not the run's context: the run may have ended by its own deadline
	// (a stall), and the question is about the dependency. The probes run
	// on their own goroutine: one that ignores its context (or panics)
	// answers "down" at AskTimeout instead of holding every failing
	// worker.
	pctx, cancel := context.WithTimeout(context.Background(), b.cfg.AskTimeout)
	defer cancel()
	res := make(chan error, 1)
	go func() {
		defer func() {
			if v := recover(); v != nil {
				res <- fmt.Errorf("idemq: probe panicked: %v", v)
			}
		}()
		var perr error
		for _, p := range b.cfg.Probes {
			if perr = p(pctx); perr != nil {
				break
			}
		}
		if perr == nil && pctx.Err() != nil {
			perr = pctx.Err()
		}
		res <- perr
	}()
	select {
	case err = <-res:
	case <-pctx.Done():
		err = fmt.Errorf("idemq: probes did not answer within %v: %w", b.cfg.AskTimeout, pctx.Err())
	}
	return err
}
