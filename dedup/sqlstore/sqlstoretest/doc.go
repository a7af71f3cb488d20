// Package sqlstoretest runs, for one SQL backend of the dedup store, the
// dedup conformance suite (dedup/storetest) and the cases only a SQL store
// has: concurrent migrations, purge in batches, the background purger, the
// inspector, configurable table names, byte-exact keys up to the maximum
// length, and failures of a closed database. It needs the database only.
//
//	func TestStorePostgres(t *testing.T) {
//		sqlstoretest.Run(t, myPostgresBackend(), sqlstoretest.Features{Parallel: true})
//	}
//
// It imports no driver: the backend ([sqldbtest.Backend]) does.
package sqlstoretest
