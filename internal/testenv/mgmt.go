package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"
)

// DefaultManagementURL is the shared broker's management API on loopback
// (scripts/services.sh enables the rabbitmq_management plugin).
const DefaultManagementURL = "http://guest:guest@127.0.0.1:15672"

// ManagementURL is IDEMQ_RABBITMQ_MGMT_URL or the loopback default.
func ManagementURL() string { return env("IDEMQ_RABBITMQ_MGMT_URL", DefaultManagementURL) }

// RequireManagement checks that the broker's management API answers and
// returns its URL. It fails the test in CI (CI=true) and skips it
// elsewhere when it does not, and skips it in fake mode.
func RequireManagement(t testing.TB) string {
	t.Helper()
	RequireRealBroker(t, "the management HTTP API")
	u := ManagementURL()
	if err := mgmtDo(context.Background(), u, http.MethodGet, "/api/overview", nil); err != nil {
		Unavailable(t, "the RabbitMQ management API (rabbitmq-plugins enable rabbitmq_management)", u, err)
	}
	return u
}

// SetPolicy sets a policy (operator: an operator policy) named name on the
// default vhost, applying to the queues matching pattern, with definition
// def (JSON), and deletes it when the test ends. Setting it again (same
// name) replaces it.
func SetPolicy(t testing.TB, operator bool, name, pattern, def string, priority int) {
	t.Helper()
	kind := "policies"
	if operator {
		kind = "operator-policies"
	}
	path := "/api/" + kind + "/%2F/" + url.PathEscape(name)
	body := fmt.Sprintf(`{"pattern":%q,"definition":%s,"priority":%d,"apply-to":"queues"}`, pattern, def, priority)
	if err := mgmtDo(context.Background(), ManagementURL(), http.MethodPut, path, []byte(body)); err != nil {
		t.Fatalf("set %s %s: %v", kind, name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := mgmtDo(ctx, ManagementURL(), http.MethodDelete, path, nil); err != nil && !errors.Is(err, errNotFound) {
			t.Errorf("delete %s %s: %v", kind, name, err)
		}
	})
}

// errNotFound: HTTP 404 (a policy set twice is deleted twice at cleanup).
var errNotFound = errors.New("HTTP 404")

func mgmtDo(ctx context.Context, raw, method, path string, body []byte) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	user := u.User
	u.User = nil
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u.String()+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if user != nil {
		p, _ := user.Password()
		req.SetBasicAuth(user.Username(), p)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return fmt.Errorf("%s %s: %w", method, path, errNotFound)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: HTTP %d", method, path, resp.StatusCode)
	}
	return nil
}

// ManagementQueueField returns one field of GET /api/queues/%2F/{queue}
// as compact JSON ("" when absent).
func ManagementQueueField(t testing.TB, queue, field string) string {
	t.Helper()
	u, err := url.Parse(ManagementURL())
	if err != nil {
		t.Fatal(err)
	}
	user := u.User
	u.User = nil
	req, err := http.NewRequest(http.MethodGet, u.String()+"/api/queues/%2F/"+url.PathEscape(queue), nil)
	if err != nil {
		t.Fatal(err)
	}
	if user != nil {
		p, _ := user.Password()
		req.SetBasicAuth(user.Username(), p)
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		return ""
	}
	var b bytes.Buffer
	if err := json.Compact(&b, m[field]); err != nil {
		return ""
	}
	return b.String()
}
