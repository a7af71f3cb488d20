package main

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/testenv"
)

// idemq gate --metrics-listen: /readyz checks the gate's broker
// connection (subscribed to its ingress queue) and its dedup store; an
// unreachable store makes it 503 and names the store.
func TestGateReadyz(t *testing.T) {
	url := testenv.RequireAMQP(t)
	_, prefix := testenv.Redis(t)
	for _, tc := range []struct {
		name     string
		extra    []string
		wantCode int
		want     []string
	}{
		{"reachable", []string{"--redis-key-prefix", prefix + ":"}, http.StatusOK, []string{`"broker":"ok"`, `"store":"ok"`}},
		{"store unreachable", []string{"--redis-url", "redis://127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)), "--no-check"},
			http.StatusServiceUnavailable, []string{`"broker":"ok"`, `"store":"dial tcp`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ingress, target := testenv.Name(t, "in"), testenv.Name(t, "tx")
			t.Cleanup(func() {
				testenv.DeleteQueue(ingress, ingress+".dlq")
				_ = testenv.Channel(t).ExchangeDelete(target, false, false)
			})
			mustRun(t, "", "topology", "apply", "--url", url, "-f", writeFile(t, `
exchanges:
  - name: `+target+`
    type: topic
queues:
  - name: `+ingress+`
    no_retry: true
`))
			addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cmd := newRootCmd()
			var logs testenv.LogBuffer
			cmd.SetOut(&logs)
			cmd.SetErr(&logs)
			cmd.SetArgs(append([]string{"gate", "--from", ingress, "--to", target, "--amqp", url,
				"--metrics-listen", addr, "--log-format", "text"}, tc.extra...))
			done := make(chan error, 1)
			go func() { done <- cmd.ExecuteContext(ctx) }()
			var code int
			var body string
			testenv.Eventually(t, 60*time.Second, "/readyz answers as expected", func() bool {
				resp, err := http.Get("http://" + addr + "/readyz")
				if err != nil {
					return false
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				code, body = resp.StatusCode, string(b)
				if code != tc.wantCode {
					return false
				}
				for _, w := range tc.want {
					if !strings.Contains(body, w) {
						return false
					}
				}
				return true
			})
			cancel()
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				t.Fatalf("gate did not stop; last /readyz %d %s\n%s", code, body, logs.String())
			}
		})
	}
}
