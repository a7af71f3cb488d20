// Package bench holds idemq's throughput benchmarks. It is its own Go module
// so that comparison code (raw amqp091-go consumers, Watermill) never enters
// the library's go.mod.
//
// Run them with `make bench` from the repository root: it pre-fills a durable
// queue with persistent 256-byte messages, measures each case three times in
// one run and writes docs/BENCHMARKS.md with medians and ratios against a raw
// amqp091-go consumer that acks each message.
package bench
