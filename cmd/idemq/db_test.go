package main

import (
	"context"
	"testing"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/dburl"
)

// testStore opens d as the CLI does and migrates its outbox table; both are
// closed at t's cleanup.
func testStore(ctx context.Context, t *testing.T, d dburl.Target) (*outbox.SQLStore, sqldb.DB) {
	t.Helper()
	db, closeDB, err := openDB(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeDB)
	store, err := openStore(ctx, d, db, outbox.DefaultTable, false, false)
	if err != nil {
		t.Fatal(err)
	}
	return store, db
}
