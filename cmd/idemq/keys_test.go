package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/testenv"
)

func TestKeysGetForget(t *testing.T) {
	client, prefix := testenv.Redis(t)
	store := redisstore.New(client, redisstore.Config{})
	ctx := context.Background()
	done := dedup.Key(prefix, "billing", "order-1")
	busy := dedup.Key(prefix, "billing", "order-2")
	if _, err := store.Claim(ctx, done, "tok-a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(ctx, done, "tok-a", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Claim(ctx, busy, "tok-b", time.Minute); err != nil {
		t.Fatal(err)
	}
	common := []string{"--group", "billing", "--prefix", prefix, "--redis-url", testenv.RedisURL()}
	keys := func(args ...string) string {
		return mustRun(t, "", append(append([]string{"keys"}, args...), common...)...)
	}
	names := map[string]string{prefix: "PREFIX"}

	golden(t, "keys_get_done", keys("get", "order-1"), names)
	golden(t, "keys_get_processing_json", keys("get", "order-2", "-o", "json"), names)
	golden(t, "keys_get_absent", keys("get", "order-9"), names)
	golden(t, "keys_forget", keys("forget", "order-1"), names)
	if _, ok, err := store.Get(ctx, done); err != nil || ok {
		t.Fatalf("record still there after forget: ok=%v err=%v", ok, err)
	}
	var v keyView
	if err := json.Unmarshal([]byte(keys("get", "order-1", "-o", "json")), &v); err != nil || v.Found {
		t.Fatalf("after forget: %+v %v", v, err)
	}
	if _, _, err := runCLI(t, "", "keys", "get", "order-1", "--redis-url", testenv.RedisURL()); err == nil || !strings.Contains(err.Error(), "--group") {
		t.Fatalf("missing --group: %v", err)
	}
}
