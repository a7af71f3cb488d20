package dedup_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idemq/idemq/dedup"
)

func TestCheckOp(t *testing.T) {
	ctx := context.Background()
	if err := dedup.CheckOp(ctx, "claim", "k"); err != nil {
		t.Fatalf("valid key, live context: %v", err)
	}
	if err := dedup.CheckOp(ctx, "claim", ""); !errors.Is(err, dedup.ErrInvalidKey) {
		t.Fatalf("empty key: %v, want ErrInvalidKey", err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	var se *dedup.StoreError
	if err := dedup.CheckOp(done, "extend", "k"); !errors.As(err, &se) || se.Op != "extend" || !errors.Is(err, context.Canceled) {
		t.Fatalf("done context: %v, want a *StoreError for extend wrapping context.Canceled", err)
	}
}

func TestWrapStoreError(t *testing.T) {
	cause := errors.New("boom")
	err := dedup.WrapStoreError("claim", cause)
	var se *dedup.StoreError
	if !errors.As(err, &se) || se.Op != "claim" || !errors.Is(err, cause) {
		t.Fatalf("%v: want a *StoreError for claim wrapping the cause", err)
	}
	if again := dedup.WrapStoreError("complete", err); again != err {
		t.Fatalf("%v: a *StoreError must pass through unchanged", again)
	}
}
