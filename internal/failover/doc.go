// Package failover connects to RabbitMQ over a list of broker URLs: each
// (re)connect is one pass over the list in a fresh random order, the node
// of the connection that just ended last, and every URL is kept out of
// logs and errors with its password (redacted). The consumer and the
// publisher of package idemq dial through it; their backoff runs between
// passes.
package failover
