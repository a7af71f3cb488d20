package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/testenv"
)

// TestKeysForgetRefusesLiveLease: `keys forget` on an ID a consumer is
// processing right now must not delete its lease (a concurrent duplicate
// would run); it shows state, owner and TTL and asks for --force.
func TestKeysForgetRefusesLiveLease(t *testing.T) {
	client, prefix := testenv.Redis(t)
	store, err := redisstore.New(client, redisstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	busy := dedup.Key(prefix, "billing", "order-2")
	if _, err := store.Claim(ctx, busy, "tok-live", time.Minute); err != nil {
		t.Fatal(err)
	}
	common := []string{"--group", "billing", "--prefix", prefix, "--redis-url", testenv.RedisURL()}
	out, _, err := runCLI(t, "", append([]string{"keys", "forget", "order-2"}, common...)...)
	if err == nil {
		t.Fatalf("forget of a live lease succeeded: %q", out)
	}
	for _, want := range []string{"processing", "tok-live", "--force"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not mention %q", err, want)
		}
	}
	if !ttlRE.MatchString(err.Error()) {
		t.Errorf("refusal %q shows no TTL", err)
	}
	rec, ok, gerr := store.Get(ctx, busy)
	if gerr != nil || !ok || rec.Owner != "tok-live" {
		t.Fatalf("the live lease was touched: %+v ok=%v err=%v", rec, ok, gerr)
	}

	out = mustRun(t, "", append([]string{"keys", "forget", "order-2", "--force"}, common...)...)
	if !strings.Contains(out, "processing") || !strings.Contains(out, "tok-live") {
		t.Errorf("forced forget does not show what it deleted: %q", out)
	}
	if _, ok, err := store.Get(ctx, busy); err != nil || ok {
		t.Fatalf("--force did not delete: ok=%v err=%v", ok, err)
	}
}
