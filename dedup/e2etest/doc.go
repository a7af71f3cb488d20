// Package e2etest holds the dedup guard's end-to-end tests: real RabbitMQ,
// the real consumer, the guard with the memory and the Redis stores, and a
// consumer process killed with SIGKILL, and the one-identity proof (an
// extractor-only ID keys the guard, the inbox and the Bloom tier alike). It
// has no API; see its _test files.
package e2etest
