// Package redisstore is the Redis backend of the dedup guard: a
// [dedup.Store] (and [dedup.Inspector]) on go-redis v9's UniversalClient, so
// a single node, Sentinel and Cluster all work.
//
// A record is one string key. Its value is "p:<token>" while a lease is held
// (the key's PX expiry is the lease) and "d" once done (PX is the dedup
// window); an absent key is an absent record, and an expired lease simply
// vanishes. Each operation is one Lua script over that one key, run with
// EVALSHA (EVAL once after a script cache flush): one round trip, atomic.
//
// Keys: the guard's key ("<prefix>:<group>:<id>") is stored as
// Config.KeyPrefix + "{" + key + "}". The braces are a Cluster hash tag: the
// slot depends on the guard key only (not on KeyPrefix), which spreads the
// IDs of one group over the whole cluster, and every script declares its one
// key in KEYS, so no operation ever crosses slots.
//
// Batches: the guard groups the claims and completes of concurrent
// deliveries ([dedup.MixedBatchStore]). On a single-node client (a plain
// or Sentinel client) a whole batch is one script call that runs each
// request's SET NX / claim / complete in order, atomic per key as the
// single calls are; a batch's keys may then be in different slots, which
// only a single node allows. Cluster and Ring clients get a pipeline of
// the per-key commands instead.
//
// Memory: a done record costs the key plus a 1-byte value and an expiry;
// see docs/BENCHMARKS.md for the measured bytes per remembered ID.
package redisstore
