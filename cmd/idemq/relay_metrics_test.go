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
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb/dburl"
)

// idemq relay --metrics-listen serves /metrics with the relay's figures,
// and /healthz.
func TestRelayCommandMetricsListen(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	path := testenv.SQLitePath(t)
	q := testenv.Queue(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	store, db := testStore(ctx, t, dburl.Target{Dialect: "sqlite", DSN: path})
	for _, id := range []string{"m-1", "m-2", "m-3"} {
		if err := store.Add(ctx, db, outbox.Message{ID: id, RoutingKey: q, Body: []byte(id)}); err != nil {
			t.Fatal(err)
		}
	}
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	cmd := newRootCmd()
	var logs testenv.LogBuffer
	cmd.SetErr(&logs)
	cmd.SetOut(&logs)
	cmd.SetArgs([]string{"relay", "--db", "sqlite://" + path, "--amqp", amqpURL, "--metrics-listen", addr, "--stats-interval", "100ms"})
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(rctx) }()
	defer func() {
		rcancel()
		if err := <-done; err != nil {
			t.Errorf("relay command: %v\n%s", err, logs.String())
		}
	}()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	want := `idemq_outbox_published_total{relay="` + outbox.DefaultTable + `"} 3`
	testenv.Eventually(t, 60*time.Second, "relay metrics show 3 published", func() bool {
		code, body := get("/metrics")
		return code == 200 && strings.Contains(body, want) && strings.Contains(body, `idemq_publisher_confirms_total{publisher="relay"} 3`)
	})
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz = %d", code)
	}
}
