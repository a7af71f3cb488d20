// Package outbox is the transactional outbox: a message is published if and
// only if the business transaction that added it commits.
//
// Add writes the message into an outbox table inside the caller's own
// transaction. A [Relay] picks committed rows, publishes each with publisher
// confirms through an [idemq.Publisher], and marks a row sent only after its
// confirm. Several relays share the work with FOR UPDATE SKIP LOCKED.
//
// The store is a statement set over idemq's SQL layer (package sqldb) and
// imports no database driver; hand it a database through a dialect
// package (sqldb/postgres with LISTEN/NOTIFY, sqldb/mysql for MySQL 8 /
// MariaDB >= 10.6, sqldb/sqlite for one relay), and your transaction the
// one way, sqldb.StdTx(tx) or postgres.PgxTx(tx):
//
//	store, _ := outbox.NewStore(ctx, postgres.Pgx(pool), outbox.StoreConfig{Listen: postgres.Listener(dbURL)}) // migrates
//	tx, _ := pool.Begin(ctx)
//	// ... business writes ...
//	_ = store.Add(ctx, postgres.PgxTx(tx), outbox.Message{ID: "order-42-created", RoutingKey: "orders", Body: b})
//	_ = tx.Commit(ctx)
//
//	relay, err := outbox.NewRelay(outbox.RelayConfig{Store: store, Publisher: pub}) // pub: an *idemq.Publisher
//	err := relay.Run(ctx) // until ctx is done; drains the batch in flight
//
// # Claiming: a lease, not a held lock
//
// The relay claims a batch in one short transaction: it selects pending rows
// with FOR UPDATE SKIP LOCKED, stamps them with its owner and a lease
// (locked_until = now + Lease), increments attempts, and commits. It then
// publishes without holding any database lock or transaction, and marks the
// confirmed rows sent in a second short statement. Claimed rows whose lease
// has expired are claimable again.
//
// Crash behaviour: a relay killed after a confirm but before its mark leaves
// the row pending with its lease; once the lease expires another relay (or
// the restarted one) publishes it again with the same message ID, which the
// consumer's dedup guard suppresses. On PostgreSQL the claims (of an
// unordered relay) and the marks commit with synchronous_commit off
// ([StoreConfig.SyncBookkeeping] turns that off): a database crash can lose
// the last few hundred milliseconds of them, and those rows are published
// again the same way, same message ID. Those are the only ways a row is
// published twice. A relay killed before a confirm loses nothing: the row is still
// pending. Since each claim counts an attempt, a row that crashes relays over
// and over ends as failed after MaxAttempts rather than looping forever.
//
// Holding the row locks during publishing (the alternative) would free rows at
// once on a crash, but would keep a transaction and a connection open per
// relay for the whole publish; the lease keeps transactions short on every
// dialect, MySQL included.
//
// # Ordering
//
// With RelayConfig.Ordered, a row that has an ordering key is claimable only
// when no earlier (smaller id) row of the same key is pending or failed, so
// the messages of one key are published one at a time, in id order; rows
// without a key are not held back. Ids are assigned at insert, so when two
// transactions add messages for one key concurrently, the order is insert
// order among committed rows: serialise writers of one key (they usually
// lock the aggregate row anyway) for strict commit order.
//
// A failed row blocks its key: publishing its successors would silently
// break the key's order, so they wait for an operator ([FailedRows], the
// CLI's `idemq relay retry-failed ID` and `idemq relay skip-failed ID`).
// Retrying makes the row pending again with fresh attempts (fix the cause
// first: bind the queue, say); it is published, then its successors.
// Skipping releases the key: the row stays failed and unpublished, its
// last_error records the skip and the key, and the successors go out. The
// relay logs each blocking row (level ERROR, with the number of rows
// waiting) and reports the rows held back (GaugeBlocked, Relay.Blocked).
// Other keys are never held back. Failed rows left by a relay older than
// this rule block their key once an ordered relay runs: list them with
// [FailedRows.Blocked] and skip those whose order no longer matters.
//
// # Failures
//
// An unroutable message (the broker returned it: no queue bound) is marked
// failed at once with the reason. Any other publish error releases the row
// with a delay (RetryBackoff) and last_error set; after MaxAttempts it is marked
// failed. A failed row holds back nothing but the later rows of its own
// ordering key, and those only with Ordered. Sent rows are purged after
// Retention, in batches; failed rows are kept.
package outbox
