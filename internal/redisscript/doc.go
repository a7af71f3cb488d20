// Package redisscript runs one Lua script many times in one pipeline, the
// way the Redis dedup stores answer a batch: EVALSHA for every call, then
// EVAL for the ones Redis had not cached (NOSCRIPT after a restart or a
// SCRIPT FLUSH).
package redisscript
