package inbox

import "time"

// Transaction paths, the first argument of [Observer.Transaction].
const (
	// PathSingle: one delivery, one transaction ([Inbox.Handler]).
	PathSingle = "single"
	// PathBatch: a batch's fast path, its rows in multi-row INSERTs and no
	// savepoints ([Batcher]).
	PathBatch = "batch"
	// PathSavepoints: a batch run again with a savepoint per delivery
	// after its fast path rolled back.
	PathSavepoints = "savepoints"
)

// Transaction results, the second argument of [Observer.Transaction].
const (
	// ResultCommitted: the transaction committed.
	ResultCommitted = "committed"
	// ResultRolledBack: rolled back on purpose — a duplicate, a handler
	// error, or a batch's fast path giving way to the savepoint path.
	ResultRolledBack = "rolled_back"
	// ResultFailed: the database failed it (begin, a statement, commit).
	ResultFailed = "failed"
)

// Observer is told how the inbox's transactions went (Config.Observer);
// metrics.Metrics.Inbox returns one that exports them to Prometheus. It is
// called from the consumer's workers, concurrently, and must not block.
type Observer interface {
	// Transaction reports one transaction: its path (PathSingle,
	// PathBatch, PathSavepoints), its result (ResultCommitted,
	// ResultRolledBack, ResultFailed) and the time from its begin to the
	// end of its commit or rollback.
	Transaction(path, result string, elapsed time.Duration)
	// Batch reports the number of deliveries gathered into one batch.
	Batch(deliveries int)
	// SavepointFallback reports a batch whose fast path rolled back and
	// ran again with a savepoint per delivery.
	SavepointFallback()
}

type nopObserver struct{}

func (nopObserver) Transaction(string, string, time.Duration) {}
func (nopObserver) Batch(int)                                 {}
func (nopObserver) SavepointFallback()                        {}
