package redisscript

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Args returns the keys and arguments of the i-th call.
type Args func(i int) (keys []string, args []any)

// Pipelined runs script n times in one pipeline on client and returns the
// n commands, each with its own reply or error. A call that met NOSCRIPT is
// sent again with EVAL in a second pipeline.
func Pipelined(ctx context.Context, client redis.UniversalClient, script *redis.Script, n int, args Args) []*redis.Cmd {
	cmds := make([]*redis.Cmd, n)
	if n == 0 {
		return cmds
	}
	pipe := client.Pipeline()
	for i := range n {
		keys, a := args(i)
		cmds[i] = script.EvalSha(ctx, pipe, keys, a...)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
	var missing []int
	for i, c := range cmds {
		if err := c.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			missing = append(missing, i)
		}
	}
	if len(missing) > 0 {
		pipe := client.Pipeline()
		for _, i := range missing {
			keys, a := args(i)
			cmds[i] = script.Eval(ctx, pipe, keys, a...)
		}
		_, _ = pipe.Exec(ctx)
	}
	return cmds
}
