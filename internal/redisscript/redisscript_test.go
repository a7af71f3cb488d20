package redisscript_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/internal/redisscript"
	"github.com/idemq/idemq/internal/testenv"
)

var incr = redis.NewScript(`return redis.call('INCRBY', KEYS[1], ARGV[1])`)

// TestPipelinedSurvivesAScriptFlush: after SCRIPT FLUSH (as after a Redis
// restart) every EVALSHA meets NOSCRIPT; each call is sent again with EVAL,
// once, and answers.
func TestPipelinedSurvivesAScriptFlush(t *testing.T) {
	r := testenv.StartPrivateRedis(t, false)
	c := r.Client()
	ctx := context.Background()
	for round, flush := range []bool{false, true, false} {
		if flush {
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		cmds := redisscript.Pipelined(ctx, c, incr, 5, func(i int) ([]string, []any) {
			return []string{fmt.Sprintf("k%d", i)}, []any{i + 1}
		})
		for i, cmd := range cmds {
			n, err := cmd.Int64()
			if err != nil {
				t.Fatalf("round %d (flush %v), call %d: %v", round, flush, i, err)
			}
			if want := int64((round + 1) * (i + 1)); n != want {
				t.Fatalf("round %d, call %d = %d, want %d (a call ran twice or not at all)", round, i, n, want)
			}
		}
	}
	if got := redisscript.Pipelined(ctx, c, incr, 0, nil); len(got) != 0 {
		t.Fatalf("0 calls answered %d commands", len(got))
	}
}
