// Package outboxtest is the conformance suite every outbox SQL backend
// runs. [Run] checks the store against the real database alone (add,
// claim, lease, ordering, failed rows, purge, stats); [RunRelay] runs
// relays end to end against the real RabbitMQ, crashes included:
//
//	func TestStore(t *testing.T)              { outboxtest.Run(t, backend(), outboxtest.Features{Parallel: true}) }
//	func TestRelay(t *testing.T)              { outboxtest.RunRelay(t, backend(), outboxtest.Features{}) }
//	func TestHelperRelayProcess(t *testing.T) { outboxtest.HelperProcess(t, backend()) }
//
// TestHelperRelayProcess is the child the crash cases re-execute (the test
// binary, -test.run=^TestHelperRelayProcess$): it runs a relay that SIGKILLs
// itself at a chosen point. Without the helper environment it skips.
package outboxtest

import (
	"context"
	"os"
	"testing"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/sqldbtest"
)

// Features describes the backend under test.
type Features struct {
	// SingleRelay: the dialect supports one relay (one claimer) only
	// (SQLite): the cases with concurrent claimers are skipped.
	SingleRelay bool
	// Parallel: the cases run in parallel (t.Parallel), each on its own
	// database.
	Parallel bool
}

// inTx runs fn in a transaction of the backend's native type, handed to
// idemq the backend's one way (Backend.Tx), and commits or rolls back.
type inTx func(ctx context.Context, commit bool, fn func(tx sqldb.Querier) error) error

// suite is a backend with its type parameter erased.
type suite struct {
	name  string
	newDB func(t testing.TB) string
	open  func(t testing.TB, dsn, table string) (*outbox.SQLStore, inTx)
	// openCfg opens a store with cfg (its Table set by the caller).
	openCfg func(t testing.TB, dsn string, cfg outbox.StoreConfig) (*outbox.SQLStore, inTx)
	f       Features
}

func newSuite[T any](b sqldbtest.Backend[T], f Features) suite {
	openCfg := func(t testing.TB, dsn string, cfg outbox.StoreConfig) (*outbox.SQLStore, inTx) {
		db, _ := b.Open(t, dsn)
		store, err := outbox.NewStore(tctx(t), db, cfg)
		if err != nil {
			t.Fatalf("outbox.NewStore: %v", err)
		}
		return store, func(ctx context.Context, commit bool, fn func(sqldb.Querier) error) error {
			native, tx, err := db.BeginNative(ctx)
			if err != nil {
				return err
			}
			if err := fn(b.Tx(native)); err != nil {
				_ = sqldb.Rollback(ctx, tx)
				return err
			}
			if !commit {
				return tx.Rollback(ctx)
			}
			return tx.Commit(ctx)
		}
	}
	return suite{
		name:    b.Name,
		newDB:   b.NewDatabase,
		f:       f,
		openCfg: openCfg,
		open: func(t testing.TB, dsn, table string) (*outbox.SQLStore, inTx) {
			return openCfg(t, dsn, outbox.StoreConfig{Table: table})
		},
	}
}

// Flavor is, in the helper process of the crash cases, the Name of the
// backend that started it.
func Flavor() string { return os.Getenv(envFlavor) }
