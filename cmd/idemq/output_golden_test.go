package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// runCLI runs the idemq command in process with args and stdin, returning
// what it printed on stdout and stderr.
func runCLI(t *testing.T, stdin string, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := newRootCmd()
	var out, errb bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	cmd.SetIn(strings.NewReader(stdin))
	err := cmd.ExecuteContext(ctx)
	return out.String(), errb.String(), err
}

func mustRun(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	out, errOut, err := runCLI(t, stdin, args...)
	if err != nil {
		t.Fatalf("idemq %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

var (
	timeRE = regexp.MustCompile(`\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})`)
	uuidRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	ttlRE  = regexp.MustCompile(`(in |"ttl": ")[0-9hms.]+`)
)

// normalise replaces run-specific names (longest first), timestamps, UUIDs
// and TTLs with placeholders.
func normalise(s string, names map[string]string) string {
	keys := make([]string, 0, len(names))
	for k := range names {
		keys = append(keys, k)
	}
	for i := range keys {
		for j := i + 1; j < len(keys); j++ {
			if len(keys[j]) > len(keys[i]) {
				keys[i], keys[j] = keys[j], keys[i]
			}
		}
	}
	for _, k := range keys {
		s = strings.ReplaceAll(s, k, names[k])
	}
	s = timeRE.ReplaceAllString(s, "<TIME>")
	s = uuidRE.ReplaceAllString(s, "<UUID>")
	return ttlRE.ReplaceAllString(s, "${1}<TTL>")
}

// golden compares got (normalised) with testdata/name.golden; -update
// rewrites it.
func golden(t *testing.T, name, got string, names map[string]string) {
	t.Helper()
	got = normalise(got, names)
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s (go test -update rewrites it)\n--- got\n%s\n--- want\n%s", name, path, got, want)
	}
}
