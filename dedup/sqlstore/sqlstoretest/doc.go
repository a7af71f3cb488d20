// Package sqlstoretest runs, for one SQL dialect of the dedup store, the
// dedup conformance suite (dedup/storetest) and the cases only a SQL store
// has: concurrent migrations, purge in batches, the background purger, the
// inspector, configurable table names, byte-exact keys up to the maximum
// length, and failures of a closed database.
//
//	func TestStore(t *testing.T) {
//		sqlstoretest.Run(t, sqlstoretest.Harness{
//			Database: func(t *testing.T) string { return testenv.PostgresDB(t) },
//			Open:     openWithItsOwnPool,
//			Broken:   storeOnAClosedPool,
//		})
//	}
//
// It imports no driver: the dialect's test does.
package sqlstoretest
