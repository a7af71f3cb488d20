package redisrecord

import (
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup"
)

// Done is the value of a done record.
const Done = "d"

// processingPrefix starts the value of a record whose lease is held; the
// scripts below spell it 'p:' too.
const processingPrefix = "p:"

// Processing is the value of a record leased to token.
func Processing(token string) string { return processingPrefix + token }

// Owner returns the token of a processing record's value v; ok is false
// when v is not one.
func Owner(v string) (token string, ok bool) { return strings.CutPrefix(v, processingPrefix) }

// Release deletes KEYS[1] when it is processing(ARGV[1]). It returns 1
// when it did, 0 otherwise.
var Release = redis.NewScript(`
if redis.call('GET', KEYS[1]) == 'p:' .. ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// Extend sets the expiry of KEYS[1] to ARGV[2] ms when it is
// processing(ARGV[1]). It returns 1 when it did, 0 otherwise.
var Extend = redis.NewScript(`
if redis.call('GET', KEYS[1]) == 'p:' .. ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

// Millis converts d to whole milliseconds for PX, rounded up, at least 1.
func Millis(d time.Duration) int64 {
	return max(int64((d+time.Millisecond-1)/time.Millisecond), 1)
}

// Claim decodes a claim script's reply {code, pttl}: 1 acquired, 2 in
// flight (pttl is the lease left; a negative one counts as 0), 3 done.
// ok is false for any other reply.
func Claim(vals []int64) (c dedup.Claim, ok bool) {
	if len(vals) != 2 {
		return dedup.Claim{}, false
	}
	switch vals[0] {
	case 1:
		return dedup.Claim{Result: dedup.Acquired}, true
	case 2:
		return dedup.Claim{Result: dedup.InFlight, LeaseLeft: max(time.Duration(vals[1])*time.Millisecond, 0)}, true
	case 3:
		return dedup.Claim{Result: dedup.Done}, true
	}
	return dedup.Claim{}, false
}
