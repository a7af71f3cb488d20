package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/display"
)

const keysLong = `Looks up or deletes the dedup record of a message ID in the Redis dedup
store. The record's key is "<prefix>:<group>:<id>", exactly as the dedup guard
builds it (dedup.Key). Forgetting a "done" record lets an operator re-run a
message on purpose: the next delivery of that ID is processed again.

forget refuses a "processing" record — a consumer holds a live lease on it
and is running the message now; deleting the lease would let a concurrent
duplicate run — and shows its owner and TTL. --force deletes it anyway.
The check and the delete are one atomic step in the store.

The Redis URL is --redis-url, else IDEMQ_REDIS_URL, else redis://127.0.0.1:6379/0.
A rediss:// URL trusts the CA certificate (PEM) in IDEMQ_REDIS_CA (default: the
system's CAs).`

type keysFlags struct {
	redisURL       string
	group          string
	prefix         string
	redisKeyPrefix string
}

func newKeysCmd() *cobra.Command {
	var f keysFlags
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Inspect and forget dedup records",
		Long:  keysLong,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.redisURL, "redis-url", "", "Redis URL (default $"+envRedisURL+")")
	pf.StringVarP(&f.group, "group", "g", "", "consumer group (required; the consumer's Group, default its queue)")
	pf.StringVar(&f.prefix, "prefix", "idemq", "key prefix of the dedup guard (dedup.Config.Prefix)")
	pf.StringVar(&f.redisKeyPrefix, "redis-key-prefix", "", "Redis key prefix of the store (redisstore.Config.KeyPrefix)")
	cmd.AddCommand(newKeysGetCmd(&f), newKeysForgetCmd(&f))
	return cmd
}

// keyStore is what the keys commands need of a dedup store.
type keyStore = dedup.KeyAdmin

// openInspector returns the dedup store the keys commands work on. It is
// the one place that knows the backend (Redis today).
func openInspector(f *keysFlags) (keyStore, func(), error) {
	// go-redis logs every failed dial of its pool to stderr; the command
	// reports the one error that matters.
	redis.SetLogger(silentRedisLog{})
	u := redisURL(f.redisURL)
	opt, err := redisOptions(u)
	if err != nil {
		return nil, nil, fmt.Errorf("redis URL %s: %w", redactURL(u), err)
	}
	client := redis.NewClient(opt)
	st, err := redisstore.New(client, redisstore.Config{KeyPrefix: f.redisKeyPrefix})
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return st, func() { client.Close() }, nil
}

func (f *keysFlags) key(id string) (string, error) {
	if f.group == "" {
		return "", errors.New("--group is required")
	}
	k := dedup.Key(f.prefix, f.group, id)
	if err := dedup.ValidateKey(k); err != nil {
		return "", err
	}
	return k, nil
}

// keyView is a dedup record as the commands print it.
type keyView struct {
	Key       string `json:"key"`
	RedisKey  string `json:"redis_key,omitempty"` // the Redis key looked up (KeyPrefix + hash tag)
	Found     bool   `json:"found"`
	State     string `json:"state,omitempty"`
	Owner     string `json:"owner,omitempty"`
	ExpiresAt string `json:"expires_at,omitempty"`
	TTL       string `json:"ttl,omitempty"`
	Forgotten bool   `json:"forgotten,omitempty"`
}

func viewOf(key string, rec dedup.Record, ok bool, now time.Time) keyView {
	v := keyView{Key: key, Found: ok}
	if !ok {
		return v
	}
	v.State, v.Owner = string(rec.State), rec.Owner
	if !rec.ExpiresAt.IsZero() {
		v.ExpiresAt = rec.ExpiresAt.UTC().Format(time.RFC3339)
		v.TTL = rec.TTL(now).Round(time.Second).String()
	}
	return v
}

func printKey(cio *cmdIO, v keyView) {
	if !v.Found {
		cio.printf("%s: not found (never seen, expired or forgotten; looked up Redis key %s)\n", v.Key, v.RedisKey)
		return
	}
	cio.printf("%s: %s", v.Key, v.State)
	if v.Owner != "" {
		cio.printf(", owner %s", v.Owner)
	}
	if v.ExpiresAt != "" {
		cio.printf(", expires %s (in %s)", v.ExpiresAt, v.TTL)
	}
	cio.printf("\n")
}

func newKeysGetCmd(f *keysFlags) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Show the dedup record of a message ID",
		Long:  keysLong,
		Args:  cobra.ExactArgs(1),
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			return withRecord(cmd, f, output, args[0], func(ctx context.Context, cio *cmdIO, ins dedup.Inspector, key string, rec dedup.Record, ok bool) error {
				v := viewOf(key, rec, ok, time.Now())
				if rk, ok := ins.(interface{ RedisKey(string) string }); ok {
					v.RedisKey = rk.RedisKey(key)
				}
				if cio.json {
					if err := cio.printJSON(v); err != nil {
						return err
					}
				} else {
					printKey(cio, v)
				}
				if !v.Found {
					return errKeyNotFound // exit status 1, after the line above
				}
				return nil
			})
		}),
	}
	addOutputFlag(cmd, &output)
	return cmd
}

func newKeysForgetCmd(f *keysFlags) *cobra.Command {
	var output string
	var force bool
	cmd := &cobra.Command{
		Use:   "forget ID",
		Short: "Delete the dedup record of a message ID so it can be processed again",
		Long:  keysLong,
		Args:  cobra.ExactArgs(1),
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			return withStore(cmd, f, output, args[0], func(ctx context.Context, cio *cmdIO, ks keyStore, key string) error {
				rec, ok, err := dedup.ForgetKey(ctx, ks, key, force)
				v := viewOf(key, rec, ok, time.Now())
				if errors.Is(err, dedup.ErrLeaseHeld) {
					return fmt.Errorf("refusing to forget %s: it is %s, owner %s, lease expires %s (in %s): a consumer is running this message now "+
						"and deleting its lease would let a duplicate run concurrently; wait for it to finish, or use --force: %w",
						key, v.State, display.OrDash(v.Owner), display.OrDash(v.ExpiresAt), display.OrDash(v.TTL), err)
				}
				if err != nil {
					return err
				}
				v.Forgotten = true
				if cio.json {
					return cio.printJSON(v)
				}
				if !ok {
					cio.printf("forgot %s (there was no record)\n", key)
					return nil
				}
				cio.printf("forgot %s (was %s", key, rec.State)
				if v.Owner != "" {
					cio.printf(", owner %s", v.Owner)
				}
				if v.ExpiresAt != "" {
					cio.printf(", expires %s (in %s)", v.ExpiresAt, v.TTL)
				}
				cio.printf(")\n")
				return nil
			})
		}),
	}
	cmd.Flags().BoolVar(&force, "force", false, "also delete a live processing lease (lets a concurrent duplicate run)")
	addOutputFlag(cmd, &output)
	return cmd
}

// withStore opens the output and the store and builds the key for id, then
// calls fn.
func withStore(cmd *cobra.Command, f *keysFlags, output, id string,
	fn func(ctx context.Context, cio *cmdIO, ks keyStore, key string) error) error {
	cio, err := newIO(cmd, output)
	if err != nil {
		return err
	}
	key, err := f.key(id)
	if err != nil {
		return err
	}
	ks, closeFn, err := openInspector(f)
	if err != nil {
		return err
	}
	defer closeFn()
	ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
	defer cancel()
	return fn(ctx, cio, ks, key)
}

// withRecord is withStore that also reads the key's record.
func withRecord(cmd *cobra.Command, f *keysFlags, output, id string,
	fn func(ctx context.Context, cio *cmdIO, ins dedup.Inspector, key string, rec dedup.Record, ok bool) error) error {
	return withStore(cmd, f, output, id, func(ctx context.Context, cio *cmdIO, ks keyStore, key string) error {
		rec, ok, err := ks.Get(ctx, key)
		if err != nil {
			return err
		}
		return fn(ctx, cio, ks, key, rec, ok)
	})
}

// errKeyNotFound is `keys get` of an absent record: the record line is
// printed, then the command exits with status 1 and no further message.
var errKeyNotFound = silentError{errors.New("dedup record not found")}

// silentError ends a command with exit status 1 without main printing it
// (the command has already said why on stdout).
type silentError struct{ error }

func (e silentError) Unwrap() error { return e.error }

// silentRedisLog drops go-redis' internal log lines.
type silentRedisLog struct{}

func (silentRedisLog) Printf(context.Context, string, ...any) {}
