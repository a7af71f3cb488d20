// Package bench holds idemq's throughput benchmarks. It is its own Go module
// so that comparison code (raw amqp091-go consumers, Watermill) never enters
// the library's go.mod.
//
// Run them with `make bench` from the repository root: it pre-fills a durable
// queue with persistent 256-byte messages, measures each case three times in
// one run and writes docs/BENCHMARKS.md with medians and ratios against a raw
// amqp091-go consumer that acks each message. bench/report also draws the
// SVG charts docs/BENCHMARKS.md links (docs/bench-*.svg); `make
// bench-report` redraws them from the existing raw file without running
// anything.
//
// `make bench-scale` is the scale run (TestScale, scale_test.go): a million
// messages through the consumer with Redis dedup and with the batch inbox
// and its purge, throughput per tenth, memory and inbox table size over
// time; it writes docs/bench-scale-raw.txt, the scale section of
// docs/BENCHMARKS.md and docs/scale-*.svg. make test runs TestScale on 2000
// messages so that the harness cannot rot.
package bench
