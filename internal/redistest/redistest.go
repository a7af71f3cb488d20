// Package redistest holds test helpers for the Redis dedup store.
package redistest

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup/redisstore"
)

// Store returns a redisstore.Store on c, failing tb when cfg is refused.
func Store(tb testing.TB, c redis.UniversalClient, cfg redisstore.Config) *redisstore.Store {
	tb.Helper()
	st, err := redisstore.New(c, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return st
}
