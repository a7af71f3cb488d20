package redisstore_test

import (
	"errors"
	"testing"

	"github.com/idemq/idemq/dedup/redisstore"
)

func TestConfigValidate(t *testing.T) {
	if err := (redisstore.Config{}).Validate(); err != nil {
		t.Fatalf("zero Config: %v", err)
	}
	if err := (redisstore.Config{WaitReplicas: -1}).Validate(); !errors.Is(err, redisstore.ErrInvalidConfig) {
		t.Fatalf("negative WaitReplicas: %v, want ErrInvalidConfig", err)
	}
}
