// Package breaker is the consumer's dependency circuit breaker: it pauses
// taking deliveries while a dependency (the database, the dedup store) is
// down, finds out when it is back (probes, or one trial delivery at a time)
// and asks the dependencies whether a failure of no known shape is an
// outage.
//
// It knows nothing of idemq's error classes: the caller says which errors
// are outages (Config.IsOutage), which may be (Config.Askable), what error
// an outage found by asking becomes (Config.Outage), and hears when an
// outage begins and ends (Config.Opened, Config.Closed). The user-facing
// contract, with every default, is idemq.BreakerConfig.
package breaker
