package main

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/idemq/idemq/internal/redact"
)

func TestRedact(t *testing.T) {
	tests := []struct{ in, want string }{
		{"amqp://guest:guest@127.0.0.1:5672/", "amqp://guest:xxxxx@127.0.0.1:5672/"},
		{"dial amqp://u:p%40ss:w/rd@host:5672/vh failed", "dial amqp://u:xxxxx@host:5672/vh failed"},
		{"redis://:s3cret@redis:6379/0", "redis://:xxxxx@redis:6379/0"},
		{"amqp://guest@host/", "amqp://guest@host/"},
		{"no url here", "no url here"},
		{"postgres://h/db?user=a&password=hunter2", "postgres://h/db?user=a&password=xxxxx"},
		{"two: amqp://a:b@h1/ and redis://c:d@h2/", "two: amqp://a:xxxxx@h1/ and redis://c:xxxxx@h2/"},
	}
	for _, tt := range tests {
		if got := redact.Text(tt.in); got != tt.want {
			t.Errorf("redact.Text(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	if got := redactURL("amqps://admin:topsecret@mq:5671/prod"); strings.Contains(got, "topsecret") || !strings.Contains(got, "admin") {
		t.Errorf("redactURL = %q", got)
	}
	if got := redactURL("redis://h:6379/0?password=p1"); strings.Contains(got, "p1") {
		t.Errorf("redactURL = %q", got)
	}
	var buf bytes.Buffer
	fmt.Fprintf(redactWriter{w: &buf}, "connecting to %s\n", "amqp://guest:guest@h/")
	if strings.Contains(buf.String(), ":guest@") {
		t.Errorf("writer leaked: %q", buf.String())
	}
	base := errors.New("inner")
	err := redactErr(fmt.Errorf("dial amqp://u:pw@h/: %w", base))
	if strings.Contains(err.Error(), "pw@") || !errors.Is(err, base) {
		t.Errorf("redactErr = %v", err)
	}
}
