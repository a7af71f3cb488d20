// Package testenv gives tests the real services started by `make services`:
// their URLs (from the IDEMQ_* variables, else the loopback defaults), a
// check that fails loudly when CI=true and a service is missing (and skips,
// saying how to start it, on a developer's machine), unique per-test names,
// a fault-injecting TCP proxy, and helpers to inspect queues.
package testenv
