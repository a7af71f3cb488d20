package redistest

import (
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/idemq/idemq/dedup/redisstore"
)

// Rueidis returns a rueidis client on the server and database of the
// go-redis client c (closed at cleanup).
func Rueidis(tb testing.TB, c redis.UniversalClient) rueidis.Client {
	tb.Helper()
	opt := c.(*redis.Client).Options()
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{opt.Addr}, SelectDB: opt.DB, Password: opt.Password, DisableCache: true})
	if err != nil {
		tb.Fatalf("rueidis client on %s db %s: %v", opt.Addr, strconv.Itoa(opt.DB), err)
	}
	tb.Cleanup(rc.Close)
	return rc
}

// RueidisStore returns a redisstore.RueidisStore on c, failing tb when cfg
// is refused.
func RueidisStore(tb testing.TB, c rueidis.Client, cfg redisstore.Config) *redisstore.RueidisStore {
	tb.Helper()
	st, err := redisstore.NewRueidis(c, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return st
}
