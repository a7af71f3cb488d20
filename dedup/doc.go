// Package dedup is the consumer-entry layer of defence: a guard middleware
// that lets one delivery of a message ID through and stops the rest, and the
// [Store] contract its backends implement.
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
