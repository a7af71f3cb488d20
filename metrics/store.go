package metrics

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/bloom"
)

// Store returns s instrumented: each call's latency
// (idemq_dedup_store_seconds{store,op}), its errors
// (idemq_dedup_store_errors_total; dedup.ErrLeaseLost is an answer, not an
// error) and, for a dedup.BatchStore, its batch sizes. The result is a
// dedup.BatchStore when s is one, so the guard still batches. Ops: claim,
// complete, release, extend, claim_batch, complete_batch, and probe (the
// breaker's dedup.Probe: its claim and release, on dedup.IsProbeKey keys).
func (m *Metrics) Store(name string, s dedup.Store) dedup.Store {
	is := &instrumented{s: s}
	for i, op := range storeOps {
		is.dur[i] = m.storeDur.WithLabelValues(name, op)
		is.errs[i] = m.storeErrors.WithLabelValues(name, op)
		is.batch[i] = m.storeBatch.WithLabelValues(name, op)
	}
	if bs, ok := s.(dedup.BatchStore); ok {
		return &instrumentedBatch{instrumented: is, bs: bs}
	}
	return is
}

const (
	opClaim = iota
	opComplete
	opRelease
	opExtend
	opClaimBatch
	opCompleteBatch
	opProbe
)

var storeOps = [...]string{"claim", "complete", "release", "extend", "claim_batch", "complete_batch", "probe"}

// opOf is op, or opProbe for a key of dedup.Probe's.
func opOf(op int, key string) int {
	if dedup.IsProbeKey(key) {
		return opProbe
	}
	return op
}

type instrumented struct {
	s     dedup.Store
	dur   [len(storeOps)]prometheus.Observer
	errs  [len(storeOps)]prometheus.Counter
	batch [len(storeOps)]prometheus.Observer
}

func (is *instrumented) done(op int, start time.Time, err error) {
	is.dur[op].Observe(time.Since(start).Seconds())
	if err != nil && !errors.Is(err, dedup.ErrLeaseLost) {
		is.errs[op].Inc()
	}
}

func (is *instrumented) Claim(ctx context.Context, key, token string, lease time.Duration) (dedup.Claim, error) {
	start := time.Now()
	c, err := is.s.Claim(ctx, key, token, lease)
	is.done(opOf(opClaim, key), start, err)
	return c, err
}

func (is *instrumented) Complete(ctx context.Context, key, token string, window time.Duration) error {
	start := time.Now()
	err := is.s.Complete(ctx, key, token, window)
	is.done(opComplete, start, err)
	return err
}

func (is *instrumented) Release(ctx context.Context, key, token string) error {
	start := time.Now()
	err := is.s.Release(ctx, key, token)
	is.done(opOf(opRelease, key), start, err)
	return err
}

func (is *instrumented) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	start := time.Now()
	err := is.s.Extend(ctx, key, token, lease)
	is.done(opExtend, start, err)
	return err
}

// DuplicateLayer passes the wrapped store's layer on (the Bloom tier).
func (is *instrumented) DuplicateLayer() string {
	if l, ok := is.s.(interface{ DuplicateLayer() string }); ok {
		return l.DuplicateLayer()
	}
	return idemq.LayerGuard
}

type instrumentedBatch struct {
	*instrumented
	bs dedup.BatchStore
}

func (ib *instrumentedBatch) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) []dedup.ClaimReply {
	start := time.Now()
	out := ib.bs.ClaimBatch(ctx, reqs)
	var err error
	for _, r := range out {
		if r.Err != nil {
			err = r.Err
			break
		}
	}
	ib.batch[opClaimBatch].Observe(float64(len(reqs)))
	ib.done(opClaimBatch, start, err)
	return out
}

func (ib *instrumentedBatch) CompleteBatch(ctx context.Context, reqs []dedup.CompleteRequest) []error {
	start := time.Now()
	out := ib.bs.CompleteBatch(ctx, reqs)
	var err error
	for _, e := range out {
		if e != nil && !errors.Is(e, dedup.ErrLeaseLost) {
			err = e
			break
		}
	}
	ib.batch[opCompleteBatch].Observe(float64(len(reqs)))
	ib.done(opCompleteBatch, start, err)
	return out
}

// StatsReader is what [Metrics.Bloom] reads: a bloom.Filter, a
// bloom.Store, a redisbloom store.
type StatsReader interface {
	Stats(ctx context.Context) (bloom.Stats, error)
}

// Bloom exports the fill of each generation, the estimated
// false-positive rate, the sized rate and the bitmap bytes of f, read at
// each scrape (bounded by a 2s timeout). name is a bounded label.
func (m *Metrics) Bloom(name string, f StatsReader) {
	m.bloom.mu.Lock()
	defer m.bloom.mu.Unlock()
	if m.bloom.filters == nil {
		m.bloom.filters = map[string]StatsReader{}
	}
	m.bloom.filters[name] = f
}

type bloomCollector struct {
	fill, fp, want, size, errs *prometheus.Desc
	mu                         sync.Mutex
	filters                    map[string]StatsReader
}

func (b *bloomCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- b.fill
	ch <- b.fp
	ch <- b.want
	ch <- b.size
	ch <- b.errs
}

func (b *bloomCollector) Collect(ch chan<- prometheus.Metric) {
	b.mu.Lock()
	filters := make(map[string]StatsReader, len(b.filters))
	for k, v := range b.filters {
		filters[k] = v
	}
	b.mu.Unlock()
	for name, f := range filters {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := f.Stats(ctx)
		cancel()
		if err != nil {
			ch <- prometheus.MustNewConstMetric(b.errs, prometheus.GaugeValue, 1, name)
			continue
		}
		ch <- prometheus.MustNewConstMetric(b.errs, prometheus.GaugeValue, 0, name)
		for i, g := range st.Generations {
			ch <- prometheus.MustNewConstMetric(b.fill, prometheus.GaugeValue, g.Fill, name, itoa(i))
		}
		ch <- prometheus.MustNewConstMetric(b.fp, prometheus.GaugeValue, st.EstimatedFPRate, name)
		ch <- prometheus.MustNewConstMetric(b.want, prometheus.GaugeValue, st.Params.FPRate, name)
		ch <- prometheus.MustNewConstMetric(b.size, prometheus.GaugeValue, float64(st.Bytes), name)
	}
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}
