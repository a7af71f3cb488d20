// Package sender adapts an [idemq.Sender] for the failure policies that
// republish deliveries (retry.Policy, the Bloom router).
package sender
