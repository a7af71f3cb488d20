package dedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/testenv"
)

// TestForgetKey against Redis: a done record is forgotten; a live lease is
// refused (and left as it was) unless forced; an absent key is no error.
func TestForgetKey(t *testing.T) {
	client, prefix := testenv.Redis(t)
	store, err := redisstore.New(client, redisstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	done := dedup.Key(prefix, "billing", "done-1")
	busy := dedup.Key(prefix, "billing", "busy-1")
	if _, err := store.Claim(ctx, done, "tok-a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(ctx, done, "tok-a", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Claim(ctx, busy, "tok-b", time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		key       string
		force     bool
		wantFound bool
		wantState dedup.State
		wantErr   error
		gone      bool
	}{
		{"done", done, false, true, dedup.StateDone, nil, true},
		{"live lease refused", busy, false, true, dedup.StateProcessing, dedup.ErrLeaseHeld, false},
		{"live lease forced", busy, true, true, dedup.StateProcessing, nil, true},
		{"absent", dedup.Key(prefix, "billing", "never"), false, false, "", nil, true},
		{"invalid key", "", false, false, "", dedup.ErrInvalidKey, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec, found, err := dedup.ForgetKey(ctx, store, c.key, c.force)
			if !errors.Is(err, c.wantErr) || (c.wantErr == nil) != (err == nil) {
				t.Fatalf("err %v, want %v", err, c.wantErr)
			}
			if found != c.wantFound || rec.State != c.wantState {
				t.Fatalf("found %v %+v", found, rec)
			}
			if found && rec.TTL(time.Now()) <= 0 {
				t.Fatalf("no TTL on %+v", rec)
			}
			if c.key == "" {
				return
			}
			_, still, err := store.Get(ctx, c.key)
			if err != nil || still == c.gone {
				t.Fatalf("after: present %v, err %v", still, err)
			}
		})
	}
}
