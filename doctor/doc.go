// Package doctor checks a deployment for the settings that silently break
// exactly-once: a Redis that evicts done records, a dedup window or inbox
// retention shorter than the time a message can come back, a work queue
// without its dead-letter queue, a classic retry queue behind a quorum
// work queue, a broker policy that drops or expires messages or lowers
// the delivery limit, pending migrations, an outbox that no relay drains.
//
// [Run] reads the broker (AMQP, and the management API when given),
// Redis and the SQL database, changes nothing, and returns a [Report]:
// one [Finding] per check and subject, PASS, WARN or FAIL, each with what
// it means for the guarantee and the exact fix. `idemq doctor` prints it
// (text or JSON) and exits non-zero on a FAIL, so it can gate a
// deployment (a CI step, a Kubernetes init container); [Report.Log]
// logs the findings that are not PASS, for a process that runs the
// doctor at start.
//
// What is not checked: the broker-wide consumer_timeout (neither AMQP nor
// the management API shows it; a queue's x-consumer-timeout argument or
// consumer-timeout policy key is checked), and anything the user
// connecting cannot read (reported as WARN "not checked", never as PASS).
package doctor
