package console_test

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/idemq/idemq/internal/console"
	"github.com/idemq/idemq/internal/testenv"
)

func TestValidateListen(t *testing.T) {
	qs := []console.Queue{console.QueueOf("orders")}
	token := "0123456789abcdef0123"
	for _, c := range []struct {
		listen, token string
		wantTokenErr  bool
		wantErr       bool
	}{
		{"", "", false, false},
		{"127.0.0.1:8080", "", false, false},
		{"127.9.9.9:0", "", false, false},
		{"localhost:8080", "", false, false},
		{"[::1]:8080", "", false, false},
		{":8080", "", true, true},
		{"0.0.0.0:8080", "", true, true},
		{"[::]:8080", "", true, true},
		{"192.168.1.10:8080", "", true, true},
		{"console.example.com:8080", "", true, true},
		{"0.0.0.0:8080", token, false, false},
		{"0.0.0.0:8080", "short", false, true},
		{"no-port", "", false, true},
	} {
		cfg := console.Config{Listen: c.listen, Token: c.token, AMQPURL: "amqp://x", Queues: qs}
		err := cfg.Validate()
		if (err != nil) != c.wantErr || errors.Is(err, console.ErrTokenRequired) != c.wantTokenErr {
			t.Errorf("listen %q token %q: %v", c.listen, c.token, err)
		}
	}
	if err := (&console.Config{AMQPURL: "amqp://x"}).Validate(); err == nil {
		t.Error("no queues accepted")
	}
	if _, err := console.New(console.Config{Listen: "0.0.0.0:0", AMQPURL: "amqp://x", Queues: qs}); !errors.Is(err, console.ErrTokenRequired) {
		t.Errorf("New beyond loopback without a token: %v", err)
	}
	if console.QueueOf("orders.dlq") != (console.Queue{Work: "orders", DLQ: "orders.dlq"}) || console.QueueOf("orders") != (console.Queue{Work: "orders", DLQ: "orders.dlq"}) {
		t.Error("QueueOf")
	}
}

// TestToken: with a token, every request carries it (cookie from the login
// form or ?token=, or a bearer header); anything else gets the login page.
func TestToken(t *testing.T) {
	testenv.RequireAMQP(t)
	p := declare(t)
	token := "s3cret-token-0123456789"
	e := newEnv(t, console.Config{Token: token, Queues: []console.Queue{console.QueueOf(p.Queue)}})

	for _, path := range []string{"/", "/dlq?q=" + p.DLQ, "/live", "/api/live", "/keys"} {
		code, body := e.get(path)
		if code != http.StatusUnauthorized || !strings.Contains(body, "Token required") || strings.Contains(body, "<table") {
			t.Fatalf("GET %s without a token: %d\n%s", path, code, body)
		}
	}
	if code, _, _ := e.post("/dlq/act", url.Values{"q": {p.DLQ}, "action": {"purge"}, "expect": {"0"}}); code != http.StatusUnauthorized {
		t.Fatalf("POST without a token: %d", code)
	}
	req, _ := http.NewRequest(http.MethodGet, e.hs.URL+"/", nil)
	req.Header.Set("Authorization", "Bearer wrong-token-0123456789")
	if code, _, _ := e.do(req); code != http.StatusUnauthorized {
		t.Fatalf("wrong bearer: %d", code)
	}
	req, _ = http.NewRequest(http.MethodGet, e.hs.URL+"/", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	if code, body, _ := e.do(req); code != http.StatusOK || !strings.Contains(body, p.DLQ) {
		t.Fatalf("bearer: %d", code)
	}
	if code, _ := e.get("/?token=nope"); code != http.StatusUnauthorized {
		t.Fatalf("wrong ?token: %d", code)
	}
	if code, _, _ := e.post("/login", url.Values{"token": {"nope"}}); code != http.StatusUnauthorized {
		t.Fatalf("wrong login: %d", code)
	}
	code, _, h := e.post("/login", url.Values{"token": {token}, "next": {"//evil.example/"}})
	if code != http.StatusSeeOther || h.Get("Location") != "/" {
		t.Fatalf("login: %d to %q", code, h.Get("Location"))
	}
	if code, body := e.get("/"); code != http.StatusOK || !strings.Contains(body, p.DLQ) || strings.Contains(body, token) {
		t.Fatalf("after login: %d", code)
	}
	// ?token= sets the cookie and drops the token from the URL.
	e2 := newEnv(t, console.Config{Token: token, Queues: []console.Queue{console.QueueOf(p.Queue)}})
	code, _ = e2.get("/live?token=" + token)
	if code != http.StatusSeeOther {
		t.Fatalf("?token: %d", code)
	}
	if code, _ := e2.get("/live"); code != http.StatusOK {
		t.Fatalf("after ?token: %d", code)
	}
	if !strings.Contains(e.logs.String(), "console request refused") {
		t.Error("refusals not logged")
	}
}

// TestCSRFAndReadOnly: a state change needs the page's CSRF token and a
// same-origin request; a read-only console refuses every change and shows
// no action; a console without a token answers loopback host names only.
func TestCSRFAndReadOnly(t *testing.T) {
	testenv.RequireAMQP(t)
	client, prefix := testenv.Redis(t)
	_ = client
	p := declare(t)
	seed(t, p, 1, "order %d not found")
	keys := keyAdmin(t, client)
	e := newEnv(t, console.Config{Queues: []console.Queue{console.QueueOf(p.Queue)}, Keys: keys, KeyPrefix: prefix})
	tok := e.csrf("/dlq/confirm?action=purge&q=" + p.DLQ)
	form := url.Values{"q": {p.DLQ}, "action": {"purge"}, "expect": {"2"}}
	for _, c := range []struct {
		name  string
		csrf  string
		cross bool
	}{
		{"no token", "", false},
		{"wrong token", strings.Repeat("x", 43), false},
		{"cross-origin", tok, true},
	} {
		f := url.Values{}
		for k, v := range form {
			f[k] = v
		}
		if c.csrf != "" {
			f.Set("csrf", c.csrf)
		}
		req, _ := http.NewRequest(http.MethodPost, e.hs.URL+"/dlq/act", strings.NewReader(f.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if c.cross {
			req.Header.Set("Sec-Fetch-Site", "cross-site")
			req.Header.Set("Origin", "https://evil.example")
		}
		if code, _, _ := e.do(req); code != http.StatusForbidden {
			t.Fatalf("%s: %d", c.name, code)
		}
	}
	if n := depth(t, p.DLQ); n != 2 {
		t.Fatalf("a refused purge deleted: %d left", n)
	}
	// Another client's token is not ours (double-submit: the cookie decides).
	other := newEnv(t, console.Config{Queues: []console.Queue{console.QueueOf(p.Queue)}})
	form.Set("csrf", other.csrf("/dlq/confirm?action=purge&q="+p.DLQ))
	if code, _, _ := e.post("/dlq/act", form); code != http.StatusForbidden {
		t.Fatalf("another session's CSRF token: %d", code)
	}
	form.Set("csrf", tok)
	if code, _, h := e.post("/dlq/act", form); code != http.StatusSeeOther || !strings.HasPrefix(h.Get("Location"), "/jobs/") {
		t.Fatalf("purge with the token: %d", code)
	} else {
		e.waitJob(h.Get("Location"))
	}
	testenv.Eventually(t, wait, "purged", func() bool { return depth(t, p.DLQ) == 0 })

	// DNS rebinding: a console without a token answers loopback names only.
	req, _ := http.NewRequest(http.MethodGet, e.hs.URL+"/", nil)
	req.Host = "attacker.example:80"
	if code, _, _ := e.do(req); code != http.StatusForbidden {
		t.Fatalf("foreign Host: %d", code)
	}

	seed(t, p, 1, "order %d not found")
	ro := newEnv(t, console.Config{ReadOnly: true, Queues: []console.Queue{console.QueueOf(p.Queue)}, Keys: keys, KeyPrefix: prefix})
	_, body := ro.get("/dlq?q=" + p.DLQ)
	if !strings.Contains(body, "read-only") || strings.Contains(body, "/dlq/confirm") {
		t.Fatalf("read-only page offers actions:\n%s", body)
	}
	tok = strings.Repeat("t", 43) // refused before any CSRF check
	for path, f := range map[string]url.Values{
		"/dlq/act":      {"q": {p.DLQ}, "action": {"purge"}, "expect": {"2"}, "csrf": {tok}},
		"/keys/forget":  {"group": {"g"}, "id": {"x"}, "csrf": {tok}},
		"/outbox/retry": {"id": {"1"}, "csrf": {tok}},
	} {
		if code, _, _ := ro.post(path, f); code != http.StatusForbidden {
			t.Fatalf("read-only POST %s: %d", path, code)
		}
	}
	if n := depth(t, p.DLQ); n != 2 {
		t.Fatalf("read-only console changed the DLQ: %d", n)
	}
}

// TestNoSecretRendered: the broker URL's password and the configured
// secrets never reach a page, even in an error.
func TestNoSecretRendered(t *testing.T) {
	testenv.RequireAMQP(t)
	bad := "amqp://admin:hunter2-secret@127.0.0.1:1/"
	e := newEnv(t, console.Config{AMQPURL: bad, Queues: []console.Queue{console.QueueOf("orders")}, Secrets: []string{"hunter2-secret"}})
	for _, path := range []string{"/", "/dlq?q=orders.dlq", "/live", "/dlq/confirm?q=orders.dlq&action=replay"} {
		_, body := e.get(path)
		if strings.Contains(body, "hunter2") {
			t.Fatalf("%s renders the password:\n%s", path, body)
		}
	}
	if _, body := e.get("/"); !strings.Contains(body, "127.0.0.1:1") {
		t.Fatalf("the broker is not named (redacted):\n%s", body)
	}
}
