package main

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/idemq/idemq/internal/testenv"
)

// TestMigrateCommand: on every dialect, `migrate up --target 1` leaves a
// database at version 1, `status` reports the later versions pending,
// concurrent `up`s bring it to the latest version once, and `status` then
// reports nothing pending.
func TestMigrateCommand(t *testing.T) {
	for _, tc := range []struct {
		name string
		db   func(testing.TB) string
	}{
		{"postgres", testenv.PostgresDB},
		{"mysql", func(t testing.TB) string { return "mysql://" + testenv.MySQLDB(t) }},
		{"sqlite", func(t testing.TB) string { return "sqlite://" + testenv.SQLitePath(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := tc.db(t)
			status := func() []migrationStatus {
				t.Helper()
				var st []migrationStatus
				if err := json.Unmarshal([]byte(mustRun(t, "", "migrate", "status", "--db", db, "-o", "json")), &st); err != nil {
					t.Fatal(err)
				}
				if len(st) != 3 {
					t.Fatalf("status of %d tables, want 3: %+v", len(st), st)
				}
				return st
			}
			for _, s := range status() {
				if s.Version != 0 || len(s.Pending) != s.Latest || s.Latest < 2 {
					t.Fatalf("fresh database: %+v", s)
				}
			}
			mustRun(t, "", "migrate", "up", "--db", db, "--target", "1")
			for _, s := range status() {
				if s.Version != 1 || len(s.Pending) != s.Latest-1 || s.Pending[0] != 2 {
					t.Fatalf("at version 1: %+v", s)
				}
			}
			var wg sync.WaitGroup
			for range 3 {
				wg.Go(func() {
					if _, errOut, err := runCLI(t, "", "migrate", "up", "--db", db); err != nil {
						t.Errorf("concurrent up: %v\n%s", err, errOut)
					}
				})
			}
			wg.Wait()
			for _, s := range status() {
				if s.Version != s.Latest || len(s.Pending) != 0 || len(s.Applied) != s.Latest {
					t.Fatalf("after up: %+v", s)
				}
			}
			out := mustRun(t, "", "migrate", "status", "--db", db, "--only", "inbox", "--inbox-table", "other_inbox")
			if !strings.Contains(out, "other_inbox") || !strings.Contains(out, "1,2") {
				t.Fatalf("status of an unmigrated table:\n%s", out)
			}
		})
	}
}

func TestMigrateRefusesUnknownComponent(t *testing.T) {
	_, _, err := runCLI(t, "", "migrate", "status", "--db", "sqlite://"+testenv.SQLitePath(t), "--only", "bloom")
	if err == nil || !strings.Contains(err.Error(), "want dedup, inbox or outbox") {
		t.Fatalf("err = %v", err)
	}
}
