// Package coalesce groups concurrent calls into batches, the way a database
// groups commits: a call made while no batch is in flight is sent at once,
// alone; calls made while batches are in flight queue up and leave together
// in the next one. There is no timer and no background goroutine to stop:
// under light load every call is sent as soon as it is made, under heavy
// load the batches grow until one round trip carries many calls.
package coalesce
