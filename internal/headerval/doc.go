// Package headerval reads and bounds AMQP header values defensively:
// whatever type a producer or the broker put in a header, a reader gets a
// value or ok=false, never a panic or an overflow; what idemq writes into
// a header is valid UTF-8 of a bounded length.
package headerval
