package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/testenv"
)

// bank consume --metrics-addr serves /metrics (outcomes, duplicates by
// layer, inbox transactions), /healthz and /readyz (consumer, PostgreSQL,
// the inbox table).
func TestBankConsumeMetricsAddr(t *testing.T) {
	testenv.RequireAMQP(t)
	bin := buildBank(t)
	db := testenv.PostgresDB(t)
	queue := testenv.Name(t, "bank")
	t.Cleanup(func() {
		testenv.DeleteQueue(queue, queue+".dlq", queue+".retry.200", queue+".retry.1000")
	})
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	cmd := exec.Command(bin, "consume", "--mode", "inbox", "--queue", queue, "--queue-type", "classic",
		"--postgres", db, "--workers", "2", "--prefetch", "20", "--metrics-addr", addr)
	cmd.Env = testenv.Env()
	out, _ := os.Create(filepath.Join(t.TempDir(), "consume.log"))
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	testenv.Eventually(t, 60*time.Second, "/readyz 200 with every check", func() bool {
		code, body := get("/readyz")
		return code == 200 && strings.Contains(body, `"consumer":"ok"`) && strings.Contains(body, `"postgres":"ok"`) &&
			strings.Contains(body, `"inbox":"ok"`)
	})
	var msgs []amqp.Publishing
	for i := range 5 {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("%s-%d", queue, i), ContentType: "application/json",
			Body: []byte(fmt.Sprintf(`{"account":"acc-%d","amount":1}`, i))})
	}
	msgs = append(msgs, msgs[0]) // a resend
	testenv.Publish(t, "", queue, msgs...)
	lbl := `{group="bank",outcome="%s",queue="` + queue + `"}`
	want := []string{
		fmt.Sprintf("idemq_deliveries_total"+lbl+" 5", "processed"),
		fmt.Sprintf("idemq_deliveries_total"+lbl+" 1", "duplicate"),
		`idemq_duplicates_total{group="bank",layer="inbox",queue="` + queue + `"} 1`,
		`idemq_inbox_transactions_total{inbox="bank",path="single",result="committed"} 5`,
		`idemq_consumer_ready{group="bank",queue="` + queue + `"} 1`,
	}
	var body string
	testenv.Eventually(t, 60*time.Second, "/metrics counts 5 processed and 1 duplicate", func() bool {
		var code int
		code, body = get("/metrics")
		if code != 200 {
			return false
		}
		for _, w := range want {
			if !strings.Contains(body, w) {
				return false
			}
		}
		return true
	})
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz = %d", code)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err, exited := waitExit(cmd, 30*time.Second); !exited || err != nil {
		b, _ := os.ReadFile(out.Name())
		t.Fatalf("exit after SIGTERM: exited=%v err=%v\n%s", exited, err, b)
	}
}
