// Package redisbloom is the Redis variant of the rotating Bloom filter of
// dedup/bloom: bitmaps shared by every consumer process.
//
// Layout, per shard s and generation index i (i = floor(unix ms / L)):
//
//	<KeyPrefix>{<Prefix>:s<s>}:gen:<i>    bitmap of m/shards bits (SETBIT/GETBIT)
//	<KeyPrefix>{<Prefix>:s<s>}:bits:<i>   count of set bits (for the fill ratio)
//
// An ID hashes to one shard; all of its k bit operations (and the counter
// and expiry updates) run in one Lua script on keys of one hash tag: one
// atomic round trip, valid in Redis Cluster. A lookup reads generations
// i+1 … i-G of its shard in one script as well.
//
// Rotation needs no coordination: every process derives the generation
// from its clock, writes go to the current one, and each key carries
// PEXPIREAT = start of generation i+G+1, plus Skew — the end of the last
// lookup that reads it. Many processes rotating "at once" just compute the
// same index and the same expiry. With persistence (AOF or RDB) the
// filter survives a Redis restart like any other key.
package redisbloom
