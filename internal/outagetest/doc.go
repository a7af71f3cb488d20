// Package outagetest holds the consumer-level dependency-outage tests: a
// private PostgreSQL (in front of an inbox) and a private Redis (in front
// of a dedup guard) are stopped for several seconds while a backlog is
// consumed, behind a retry policy with small MaxAttempts and short delays.
// Nothing may be dead-lettered or lost, everything applies once, and the
// backlog drains soon after the dependency is back.
package outagetest
