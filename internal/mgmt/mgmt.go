package mgmt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idemq/idemq/internal/redact"
)

// Sources of a delivery limit ([Limit.Source]).
const (
	SourceArgument       = "argument"        // the queue's x-delivery-limit argument
	SourcePolicy         = "policy"          // a policy's delivery-limit
	SourceOperatorPolicy = "operator-policy" // an operator policy's delivery-limit
	SourceNone           = "none"            // nothing sets one
)

// BrokerDefaultDeliveryLimit is the delivery limit RabbitMQ 4.0 and later
// give a quorum queue that nothing else sets one for.
const BrokerDefaultDeliveryLimit = 20

// Limit is the delivery limit the broker applies to a queue.
type Limit struct {
	// N is the limit: a delivery whose x-delivery-count would exceed it is
	// dropped or dead-lettered by the broker. Meaningful when Source is
	// not [SourceNone] (a limit of 0 is possible); 0 with SourceNone: no
	// source sets one (see Default4x) or the queue is not a quorum queue.
	N int
	// Source says where N comes from: [SourceArgument], [SourcePolicy],
	// [SourceOperatorPolicy] or [SourceNone].
	Source string
	// Name is the policy or operator policy that sets it ("" otherwise).
	Name string
	// Type is the queue's type (quorum, classic, stream). Only quorum
	// queues have a delivery limit.
	Type string
	// Default4x: N is 0 but the queue is a quorum queue, so RabbitMQ 4.0+
	// applies its default of [BrokerDefaultDeliveryLimit] (3.x: none).
	Default4x bool
}

// String describes the limit for a log line or a terminal: "4 (policy
// dl-test)", "5 (argument x-delivery-limit)", "none (RabbitMQ 4.0+: 20)".
func (l Limit) String() string {
	switch {
	case l.Type != "" && l.Type != "quorum":
		return "none (" + l.Type + " queue)"
	case l.N <= 0 && l.Default4x:
		return fmt.Sprintf("none (RabbitMQ 4.0+: %d)", BrokerDefaultDeliveryLimit)
	case l.N <= 0:
		return "none"
	case l.Source == SourceArgument:
		return fmt.Sprintf("%d (argument x-delivery-limit)", l.N)
	}
	return fmt.Sprintf("%d (%s %s)", l.N, l.Source, l.Name)
}

// Queue is the part of GET /api/queues/{vhost}/{name} the limit depends on.
type Queue struct {
	Name           string          `json:"name"`
	Vhost          string          `json:"vhost"`
	Type           string          `json:"type"`
	Arguments      map[string]any  `json:"arguments"`
	Policy         string          `json:"policy"`
	OperatorPolicy string          `json:"operator_policy"`
	Effective      json.RawMessage `json:"effective_policy_definition"`
	// OperatorDefinition is the operator policy's definition, when it
	// could be read (GET /api/operator-policies/{vhost}/{name}); nil
	// otherwise (effective_policy_definition includes it on 3.10+).
	OperatorDefinition map[string]any `json:"-"`
	// statsIn: the response carried the statistics fields (policy names,
	// effective definition); false right after the queue was declared.
	statsIn bool
}

// ErrMalformed is wrapped by the errors of a response that is not the
// queue object the API documents, or a limit that is not an integer.
var ErrMalformed = errors.New("mgmt: malformed management API response")

// ParseQueue decodes the JSON of GET /api/queues/{vhost}/{name}.
func ParseQueue(body []byte) (Queue, error) {
	var q Queue
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	if err := d.Decode(&q); err != nil {
		return Queue{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(body, &keys); err != nil {
		return Queue{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	_, q.statsIn = keys["effective_policy_definition"]
	return q, nil
}

// StatsIn reports whether the response carried the queue's statistics
// (policy, operator_policy, effective_policy_definition): the management
// API adds them at its first statistics collection after the declare.
func (q Queue) StatsIn() bool { return q.statsIn }

// definition decodes effective_policy_definition: an object, or [] / null
// when no policy applies (Erlang's empty list).
func (q Queue) definition() (map[string]any, error) {
	raw := bytes.TrimSpace(q.Effective)
	if len(raw) == 0 || string(raw) == "null" || string(raw) == "[]" {
		return nil, nil
	}
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: effective_policy_definition: %w", ErrMalformed, err)
	}
	return m, nil
}

// Definition is the effective policy definition applied to the queue
// (policy merged with the operator policy), nil when none applies.
func (q Queue) Definition() (map[string]any, error) { return q.definition() }

// ConsumerTimeout is the consumer timeout the broker applies to q, where
// it shows one: the smaller of the queue's x-consumer-timeout argument and
// the consumer-timeout key of the policies that apply (RabbitMQ 3.12+
// enforces both; the broker-wide consumer_timeout is not visible over
// the API). ok is false when neither is set.
func ConsumerTimeout(q Queue) (d time.Duration, source string, ok bool, err error) {
	if v, found := q.Arguments["x-consumer-timeout"]; found {
		n, err := intValue(v)
		if err != nil {
			return 0, "", false, fmt.Errorf("x-consumer-timeout: %w", err)
		}
		d, source, ok = time.Duration(n)*time.Millisecond, "argument x-consumer-timeout", true
	}
	def, err := q.definition()
	if err != nil {
		return 0, "", false, err
	}
	if v, found := def["consumer-timeout"]; found {
		n, err := intValue(v)
		if err != nil {
			return 0, "", false, fmt.Errorf("policy consumer-timeout: %w", err)
		}
		if p := time.Duration(n) * time.Millisecond; !ok || p < d {
			d, source, ok = p, "policy "+q.Policy, true
		}
	}
	return d, source, ok, nil
}

// intValue reads a limit: a JSON integer (or an integral float), in int
// range. A string, a fraction, a bool is an error.
func intValue(v any) (int, error) {
	switch n := v.(type) {
	case json.Number:
		if i, err := n.Int64(); err == nil {
			if i > math.MaxInt32 || i < math.MinInt32 {
				return 0, fmt.Errorf("%s is out of range", n)
			}
			return int(i), nil
		}
		f, err := n.Float64()
		if err != nil || f != math.Trunc(f) || f > math.MaxInt32 || f < math.MinInt32 {
			return 0, fmt.Errorf("%s is not an integer", n)
		}
		return int(f), nil
	case float64:
		if n != math.Trunc(n) || n > math.MaxInt32 || n < math.MinInt32 {
			return 0, fmt.Errorf("%v is not an integer", n)
		}
		return int(n), nil
	case int:
		return n, nil
	case int64:
		if n > math.MaxInt32 || n < math.MinInt32 {
			return 0, fmt.Errorf("%d is out of range", n)
		}
		return int(n), nil
	}
	return 0, fmt.Errorf("%v (%T) is not a number", v, v)
}

// Resolve returns the delivery limit that applies to q: the smallest of
// the x-delivery-limit argument, the effective policy definition's
// delivery-limit (the policy merged with the operator policy) and the
// operator policy's own, when known. A negative value (RabbitMQ 4.0+: -1,
// "no limit") yields to any non-negative one. A value that is not an
// integer is an error ([ErrMalformed]): RabbitMQ refuses to declare one,
// so it means the response is not what idemq understands, and guessing
// would be worse than saying so.
func Resolve(q Queue) (Limit, error) {
	l := Limit{Type: q.Type, Source: SourceNone}
	if q.Type != "" && q.Type != "quorum" {
		return l, nil
	}
	type cand struct {
		n      int
		source string
		name   string
	}
	var cands []cand
	if v, ok := q.Arguments["x-delivery-limit"]; ok {
		n, err := intValue(v)
		if err != nil {
			return Limit{}, fmt.Errorf("%w: argument x-delivery-limit: %w", ErrMalformed, err)
		}
		cands = append(cands, cand{n, SourceArgument, ""})
	}
	def, err := q.definition()
	if err != nil {
		return Limit{}, err
	}
	if v, ok := def["delivery-limit"]; ok {
		n, err := intValue(v)
		if err != nil {
			return Limit{}, fmt.Errorf("%w: effective_policy_definition delivery-limit: %w", ErrMalformed, err)
		}
		src, name := SourcePolicy, q.Policy
		switch {
		case name == "":
			src, name = SourceOperatorPolicy, q.OperatorPolicy
		case q.OperatorPolicy != "" && q.OperatorDefinition == nil:
			// Merged with an operator policy idemq could not read: either
			// may have set it.
			name += " (merged with operator policy " + q.OperatorPolicy + ")"
		}
		cands = append(cands, cand{n, src, name})
	}
	if v, ok := q.OperatorDefinition["delivery-limit"]; ok && q.OperatorPolicy != "" {
		n, err := intValue(v)
		if err != nil {
			return Limit{}, fmt.Errorf("%w: operator policy %q delivery-limit: %w", ErrMalformed, q.OperatorPolicy, err)
		}
		cands = append(cands, cand{n, SourceOperatorPolicy, q.OperatorPolicy})
	}
	best := -1
	for i, c := range cands {
		if c.n < 0 {
			continue // 4.0+: no limit, unless another source sets one
		}
		// Ties go to the operator policy (it wins the merge), then the
		// policy, then the argument: the later candidate.
		if best < 0 || c.n <= cands[best].n {
			best = i
		}
	}
	if best < 0 {
		l.Default4x = len(cands) == 0
		return l, nil
	}
	c := cands[best]
	l.N, l.Source, l.Name = c.n, c.source, c.name
	return l, nil
}

// ErrStatus is wrapped by the error of a response other than 200 OK;
// errors.As reaches the *StatusError.
var ErrStatus = errors.New("mgmt: management API request failed")

// StatusError is an HTTP response other than 200 OK.
type StatusError struct {
	URL  string // redacted
	Code int
	Body string // the first bytes of the response
}

func (e *StatusError) Error() string {
	hint := ""
	switch e.Code {
	case http.StatusUnauthorized:
		hint = " (wrong user or password)"
	case http.StatusForbidden:
		hint = " (the user needs the monitoring or management tag and access to the vhost)"
	case http.StatusNotFound:
		hint = " (no such queue or vhost)"
	}
	return fmt.Sprintf("mgmt: GET %s: HTTP %d%s: %s", e.URL, e.Code, hint, e.Body)
}

func (e *StatusError) Is(target error) bool { return target == ErrStatus }

// Permanent reports whether retrying cannot fix the error: wrong
// credentials, no permission, queue or vhost not found, or a response
// idemq does not understand.
func Permanent(err error) bool {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Code == http.StatusUnauthorized || se.Code == http.StatusForbidden ||
			se.Code == http.StatusNotFound || se.Code == http.StatusBadRequest
	}
	return errors.Is(err, ErrInvalidURL) || errors.Is(err, ErrMalformed)
}

// ErrInvalidURL is wrapped by the error of a management URL that does not
// parse or is not http(s).
var ErrInvalidURL = errors.New("mgmt: invalid management URL")

// ErrNoStats is wrapped by the error of [Client.Queue] when the context
// ended before the API reported the queue's statistics (policy fields).
var ErrNoStats = errors.New("mgmt: queue statistics not reported yet")

// Client reads queues from one management API endpoint.
type Client struct {
	base     url.URL // scheme://host[:port][/path prefix], no user info
	user     string
	pass     string
	redacted string
	hc       *http.Client
	// Poll is the wait between two reads of a queue whose statistics are
	// not in yet. Default 250ms.
	Poll time.Duration
}

// New parses rawURL — http(s)://user:password@host:15672[/prefix] — and
// returns a client. hc nil: a client with a 10 s timeout per request.
func New(rawURL string, hc *http.Client) (*Client, error) {
	red := redact.URL(rawURL)
	u, err := url.Parse(strings.TrimSpace(rawURL))
	if err != nil {
		return nil, fmt.Errorf("%w %s: does not parse", ErrInvalidURL, red)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%w %s: scheme must be http or https", ErrInvalidURL, red)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%w %s: no host", ErrInvalidURL, red)
	}
	c := &Client{redacted: red, hc: hc, Poll: 250 * time.Millisecond}
	if u.User != nil {
		c.user = u.User.Username()
		c.pass, _ = u.User.Password()
	}
	c.base = url.URL{Scheme: u.Scheme, Host: u.Host, Path: strings.TrimSuffix(u.Path, "/")}
	if c.hc == nil {
		c.hc = &http.Client{Timeout: 10 * time.Second}
	}
	return c, nil
}

// String is the URL redacted.
func (c *Client) String() string { return c.redacted }

func (c *Client) get(ctx context.Context, path string, into func([]byte) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base.String()+path, nil)
	if err != nil {
		return fmt.Errorf("%w %s: %w", ErrInvalidURL, c.redacted, err)
	}
	if c.user != "" || c.pass != "" {
		req.SetBasicAuth(c.user, c.pass)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		// net/http's errors name the request URL, which carries no user
		// info; redact anyway (a password in a path prefix, a query).
		return fmt.Errorf("mgmt: GET %s%s: %s", c.redacted, path, redact.Scrub(err.Error(), []string{c.pass}))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("mgmt: GET %s%s: read body: %w", c.redacted, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return &StatusError{URL: c.redacted + path, Code: resp.StatusCode, Body: strings.TrimSpace(redact.Scrub(string(body[:min(len(body), 200)]), []string{c.pass}))}
	}
	return into(body)
}

// seg escapes one path segment (the vhost "/" is %2F, as the API wants).
func seg(s string) string { return url.PathEscape(s) }

// Queue reads queue name in vhost, waiting (every Poll, until ctx ends)
// for its statistics when it was declared a moment ago, and the operator
// policy's definition when one applies and the user may read it.
func (c *Client) Queue(ctx context.Context, vhost, name string) (Queue, error) {
	for {
		q, err := c.QueueNow(ctx, vhost, name)
		if err != nil {
			return Queue{}, err
		}
		if q.StatsIn() {
			return q, nil
		}
		t := time.NewTimer(c.Poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return Queue{}, fmt.Errorf("%w for queue %q in vhost %q at %s (the API collects them every few seconds): %w",
				ErrNoStats, name, vhost, c.redacted, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// QueueNow reads the queue once, whether or not its statistics are in
// yet ([Queue.StatsIn]: without them its type and arguments are there,
// its policies are not).
func (c *Client) QueueNow(ctx context.Context, vhost, name string) (Queue, error) {
	var q Queue
	err := c.get(ctx, "/api/queues/"+seg(vhost)+"/"+seg(name), func(b []byte) (err error) { q, err = ParseQueue(b); return err })
	if err != nil {
		return Queue{}, err
	}
	if q.StatsIn() && q.OperatorPolicy != "" {
		c.operatorDefinition(ctx, &q)
	}
	return q, nil
}

// operatorDefinition adds the operator policy's definition to q, when the
// user may read it (GET /api/operator-policies needs the policymaker or
// administrator tag). Without it, effective_policy_definition — which
// includes the operator policy on 3.10 and later — is what counts.
func (c *Client) operatorDefinition(ctx context.Context, q *Queue) {
	var p struct {
		Definition map[string]any `json:"definition"`
	}
	err := c.get(ctx, "/api/operator-policies/"+seg(q.Vhost)+"/"+seg(q.OperatorPolicy), func(b []byte) error {
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		return d.Decode(&p)
	})
	if err == nil {
		q.OperatorDefinition = p.Definition
	}
}

// DeliveryLimit reads queue name in vhost and resolves its delivery limit
// ([Resolve]).
func (c *Client) DeliveryLimit(ctx context.Context, vhost, name string) (Limit, error) {
	q, err := c.Queue(ctx, vhost, name)
	if err != nil {
		return Limit{}, err
	}
	l, err := Resolve(q)
	if err != nil {
		return Limit{}, fmt.Errorf("queue %q in vhost %q at %s: %w", name, vhost, c.redacted, err)
	}
	return l, nil
}
