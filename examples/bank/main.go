// Command bank is the idemq demonstration: transfers whose effect
// (balance += amount) is deliberately not idempotent, consumed in one of three
// modes — none (unprotected, to show the problem), dedup (a Redis dedup
// guard) or inbox (an inbox row in the same PostgreSQL transaction).
//
//	bank consume [--mode none|dedup|inbox] [--queue bank.transfers] [--queue-type quorum|classic]
//	             [--amqp URL] [--postgres URL] [--redis URL] [--workers N] [--prefetch N]
//	bank demo    [--messages N] [--kills N] [--cuts N] [--proxy-cuts N] [--redis-restarts N]
//	             [--db-outages N --db-outage-duration D] [--redis-outages N --redis-outage-duration D]
//	             [--freezes N --freeze-duration D] [--modes none,dedup,dedup-nopersist,inbox]
//
// The demo's faults: consumers SIGKILLed (by the demo and by themselves at
// crash points), publisher resends, broker connection cuts (rabbitmqctl
// close_all_connections), cuts of every consumer connection by a TCP proxy
// of the demo's (--proxy-cuts), and SIGKILL + restart of a private
// redis-server used by the dedup modes (--redis-restarts): with an
// append-only file fsynced on every write for dedup, without persistence
// for dedup-nopersist. The dependency-outage phase (--db-outages,
// --redis-outages) stops a private PostgreSQL of the demo's (pg_ctl stop -m
// immediate) or the dedup modes' private Redis for a while during a backlog:
// consumers pause (breaker), a consumer started mid-outage waits, and no
// valid transfer may be dead-lettered. The freeze fault (--freezes) makes a
// running consumer stop itself (SIGSTOP) in a handler — effect written,
// transaction open, dedup lease held — and continues it (SIGCONT) after
// --freeze-duration, longer than its 2 s dedup lease: the process that
// wakes up must not apply the transfer again.
//
// A transfer is a persistent message on the default exchange, routing key
// the queue name, message_id the transfer ID and body
// {"account":"<id>","amount":<int64>}. A message without a usable
// message_id or with any other body ends up in <queue>.dlq with a reason.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "consume":
		err = consumeMain(os.Args[2:])
	case "demo":
		err = demoMain(os.Args[2:])
	case "-h", "--help", "help":
		usage()
		return
	default:
		fmt.Fprintf(os.Stderr, "bank: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bank:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, `usage:
  bank consume [--mode none|dedup|inbox] [--queue NAME] [--queue-type quorum|classic]
               [--amqp URL] [--postgres URL] [--redis URL] [--workers N] [--prefetch N]
  bank demo    [--messages N] [--kills N] [--cuts N] [--proxy-cuts N] [--redis-restarts N] [--freezes N]
               [--modes none,dedup,dedup-nopersist,inbox]   (bank demo -h for every flag)`)
}
