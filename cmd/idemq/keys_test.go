package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/testenv"
)

func TestKeysGetForget(t *testing.T) {
	client, prefix := testenv.Redis(t)
	store, err := redisstore.New(client, redisstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
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
	absent, _, err := runCLI(t, "", append([]string{"keys", "get", "order-9"}, common...)...)
	if !errors.Is(err, errKeyNotFound) {
		t.Fatalf("keys get of an absent record: err %v, want errKeyNotFound (exit status 1)", err)
	}
	golden(t, "keys_get_absent", absent, names)
	golden(t, "keys_forget", keys("forget", "order-1"), names)
	if _, ok, err := store.Get(ctx, done); err != nil || ok {
		t.Fatalf("record still there after forget: ok=%v err=%v", ok, err)
	}
	var v keyView
	forgotten, _, _ := runCLI(t, "", append([]string{"keys", "get", "order-1", "-o", "json"}, common...)...)
	if err := json.Unmarshal([]byte(forgotten), &v); err != nil || v.Found || v.RedisKey != "{"+done+"}" {
		t.Fatalf("after forget: %+v %v", v, err)
	}
	if _, _, err := runCLI(t, "", "keys", "get", "order-1", "--redis-url", testenv.RedisURL()); err == nil || !strings.Contains(err.Error(), "--group") {
		t.Fatalf("missing --group: %v", err)
	}
}

// With Redis unreachable, `keys get` fails with one error and no client
// noise (go-redis logged every failed dial to stderr).
func TestKeysGetRedisUnreachable(t *testing.T) {
	var stderr strings.Builder
	oldStderr := os.Stderr
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	os.Stderr = w
	done := make(chan struct{})
	go func() { io.Copy(&stderr, r); close(done) }()
	port := testenv.FreePort(t)
	out, errOut, runErr := runCLI(t, "", "keys", "get", "order-1", "--group", "billing", "--redis-url", "redis://127.0.0.1:"+strconv.Itoa(port)+"/0")
	w.Close()
	os.Stderr = oldStderr
	<-done
	if runErr == nil || errors.Is(runErr, errKeyNotFound) {
		t.Fatalf("keys get with Redis down: %v, want a connection error", runErr)
	}
	if noise := stderr.String() + errOut + out; strings.TrimSpace(noise) != "" {
		t.Fatalf("client noise besides the error:\n%s", noise)
	}
}
