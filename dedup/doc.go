// Package dedup is the consumer-entry layer of defence: a [Guard] that lets
// one delivery of a message ID through and stops the rest, and the [Store]
// contract its backends implement. The guard has a fixed place in an
// idemq.Pipeline (Pipeline.Guard): inside the failure policy, outside the
// handler (and so outside any database transaction). It keys on the ID the
// consumer decided (idemq.Delivery.ID), and reports a duplicate by returning
// idemq.ErrDuplicate: the consumer acks it and counts it.
//
// A dedup record has three states — absent, processing (a lease held by an
// owner token) and done (kept for the dedup window) — and four atomic
// operations: [Store.Claim], [Store.Complete], [Store.Release] and
// [Store.Extend]. The naive recipe (SETNX, then process) loses a message whose
// handler fails after the SETNX; a lease that is released on failure, and that
// expires when its owner dies, does not.
//
// Backends: the in-memory [Memory] store here; Redis in dedup/redisstore; SQL
// (PostgreSQL, MySQL/MariaDB, SQLite) in dedup/sqlstore. Every backend passes
// the same conformance suite, dedup/storetest.
package dedup
