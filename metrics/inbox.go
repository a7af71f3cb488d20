package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemq/idemq/inbox"
)

var (
	inboxPaths   = [...]string{inbox.PathSingle, inbox.PathBatch, inbox.PathSavepoints}
	inboxResults = [...]string{inbox.ResultCommitted, inbox.ResultRolledBack, inbox.ResultFailed}
)

// InboxRecorder is the [inbox.Observer] of an inbox (inbox.Config.Observer),
// labelled inbox=name: transaction latency by path
// (idemq_inbox_transaction_seconds), transactions by path and result
// (idemq_inbox_transactions_total), deliveries per batch
// (idemq_inbox_batch_size) and savepoint fallbacks
// (idemq_inbox_savepoint_fallbacks_total).
type InboxRecorder struct {
	dur       [len(inboxPaths)]prometheus.Observer
	tx        [len(inboxPaths)][len(inboxResults)]prometheus.Counter
	batch     prometheus.Observer
	fallbacks prometheus.Counter
}

var _ inbox.Observer = (*InboxRecorder)(nil)

// Inbox returns the observer of the inbox called name (its table, or the
// consumer it serves: a bounded name). Every series it can write exists
// from this call on, at zero.
func (m *Metrics) Inbox(name string) *InboxRecorder {
	r := &InboxRecorder{
		batch:     m.inboxBatch.WithLabelValues(name),
		fallbacks: m.inboxFallbacks.WithLabelValues(name),
	}
	for i, p := range inboxPaths {
		r.dur[i] = m.inboxTxDur.WithLabelValues(name, p)
		for j, res := range inboxResults {
			r.tx[i][j] = m.inboxTx.WithLabelValues(name, p, res)
		}
	}
	return r
}

func index(set []string, v string) int {
	for i, s := range set {
		if s == v {
			return i
		}
	}
	return -1
}

// Transaction implements [inbox.Observer]. Paths and results it does not
// know are ignored (bounded labels).
func (r *InboxRecorder) Transaction(path, result string, elapsed time.Duration) {
	p, res := index(inboxPaths[:], path), index(inboxResults[:], result)
	if p < 0 || res < 0 {
		return
	}
	r.dur[p].Observe(elapsed.Seconds())
	r.tx[p][res].Inc()
}

// Batch implements [inbox.Observer].
func (r *InboxRecorder) Batch(deliveries int) { r.batch.Observe(float64(deliveries)) }

// SavepointFallback implements [inbox.Observer].
func (r *InboxRecorder) SavepointFallback() { r.fallbacks.Inc() }
