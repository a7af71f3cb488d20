package mgmt

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestResolve(t *testing.T) {
	tests := []struct {
		name    string
		json    string
		opDef   map[string]any
		want    Limit
		wantErr bool
	}{
		{name: "absent", json: `{"type":"quorum","arguments":{},"effective_policy_definition":[]}`,
			want: Limit{Type: "quorum", Source: SourceNone, Default4x: true}},
		{name: "absent, null definition", json: `{"type":"quorum","arguments":{"x-queue-type":"quorum"},"effective_policy_definition":null}`,
			want: Limit{Type: "quorum", Source: SourceNone, Default4x: true}},
		{name: "classic queue", json: `{"type":"classic","arguments":{"x-delivery-limit":3}}`,
			want: Limit{Type: "classic", Source: SourceNone}},
		{name: "argument", json: `{"type":"quorum","arguments":{"x-delivery-limit":5},"effective_policy_definition":[]}`,
			want: Limit{N: 5, Type: "quorum", Source: SourceArgument}},
		{name: "policy", json: `{"type":"quorum","policy":"p","effective_policy_definition":{"delivery-limit":4}}`,
			want: Limit{N: 4, Type: "quorum", Source: SourcePolicy, Name: "p"}},
		{name: "policy below argument", json: `{"type":"quorum","arguments":{"x-delivery-limit":5},"policy":"p","effective_policy_definition":{"delivery-limit":4}}`,
			want: Limit{N: 4, Type: "quorum", Source: SourcePolicy, Name: "p"}},
		{name: "argument below policy", json: `{"type":"quorum","arguments":{"x-delivery-limit":2},"policy":"p","effective_policy_definition":{"delivery-limit":4}}`,
			want: Limit{N: 2, Type: "quorum", Source: SourceArgument}},
		{name: "operator policy alone", json: `{"type":"quorum","operator_policy":"o","effective_policy_definition":{"delivery-limit":3}}`,
			want: Limit{N: 3, Type: "quorum", Source: SourceOperatorPolicy, Name: "o"}},
		{name: "operator policy below policy (merged, operator readable)",
			json:  `{"type":"quorum","arguments":{"x-delivery-limit":5},"policy":"p","operator_policy":"o","effective_policy_definition":{"delivery-limit":3}}`,
			opDef: map[string]any{"delivery-limit": 3},
			want:  Limit{N: 3, Type: "quorum", Source: SourceOperatorPolicy, Name: "o"}},
		{name: "operator policy below policy (merged, operator unreadable)",
			json: `{"type":"quorum","policy":"p","operator_policy":"o","effective_policy_definition":{"delivery-limit":3}}`,
			want: Limit{N: 3, Type: "quorum", Source: SourcePolicy, Name: "p (merged with operator policy o)"}},
		{name: "operator definition lower than the effective one",
			json:  `{"type":"quorum","policy":"p","operator_policy":"o","effective_policy_definition":{"delivery-limit":6}}`,
			opDef: map[string]any{"delivery-limit": 2},
			want:  Limit{N: 2, Type: "quorum", Source: SourceOperatorPolicy, Name: "o"}},
		{name: "policy without delivery-limit", json: `{"type":"quorum","policy":"p","effective_policy_definition":{"max-length":10}}`,
			want: Limit{Type: "quorum", Source: SourceNone, Default4x: true}},
		{name: "4.x: -1 yields to a limit", json: `{"type":"quorum","arguments":{"x-delivery-limit":-1},"policy":"p","effective_policy_definition":{"delivery-limit":7}}`,
			want: Limit{N: 7, Type: "quorum", Source: SourcePolicy, Name: "p"}},
		{name: "4.x: -1 alone is no limit", json: `{"type":"quorum","arguments":{"x-delivery-limit":-1},"effective_policy_definition":[]}`,
			want: Limit{Type: "quorum", Source: SourceNone}},
		{name: "zero", json: `{"type":"quorum","arguments":{"x-delivery-limit":0},"effective_policy_definition":[]}`,
			want: Limit{N: 0, Type: "quorum", Source: SourceArgument}},
		{name: "integral float", json: `{"type":"quorum","arguments":{"x-delivery-limit":4.0}}`,
			want: Limit{N: 4, Type: "quorum", Source: SourceArgument}},
		{name: "argument a string", json: `{"type":"quorum","arguments":{"x-delivery-limit":"4"}}`, wantErr: true},
		{name: "argument a fraction", json: `{"type":"quorum","arguments":{"x-delivery-limit":4.5}}`, wantErr: true},
		{name: "argument huge", json: `{"type":"quorum","arguments":{"x-delivery-limit":1e30}}`, wantErr: true},
		{name: "policy a bool", json: `{"type":"quorum","policy":"p","effective_policy_definition":{"delivery-limit":true}}`, wantErr: true},
		{name: "definition a string", json: `{"type":"quorum","policy":"p","effective_policy_definition":"x"}`, wantErr: true},
		{name: "operator definition a string", json: `{"type":"quorum","operator_policy":"o","effective_policy_definition":[]}`,
			opDef: map[string]any{"delivery-limit": "3"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, err := ParseQueue([]byte(tt.json))
			if err != nil {
				t.Fatal(err)
			}
			q.OperatorDefinition = tt.opDef
			got, err := Resolve(q)
			if tt.wantErr {
				if !errors.Is(err, ErrMalformed) || !Permanent(err) {
					t.Fatalf("Resolve = %+v, %v; want an ErrMalformed", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("Resolve = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseQueueStats(t *testing.T) {
	fresh, err := ParseQueue([]byte(`{"name":"q","type":"quorum","arguments":{}}`))
	if err != nil || fresh.StatsIn() {
		t.Fatalf("fresh queue: StatsIn = %v, %v; want false", fresh.StatsIn(), err)
	}
	in, err := ParseQueue([]byte(`{"name":"q","type":"quorum","arguments":{},"policy":null,"effective_policy_definition":[]}`))
	if err != nil || !in.StatsIn() {
		t.Fatalf("queue with statistics: StatsIn = %v, %v; want true", in.StatsIn(), err)
	}
	if _, err := ParseQueue([]byte(`[1]`)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("ParseQueue([1]) = %v, want ErrMalformed", err)
	}
}

func TestLimitString(t *testing.T) {
	for _, tt := range []struct {
		l    Limit
		want string
	}{
		{Limit{N: 4, Type: "quorum", Source: SourcePolicy, Name: "p"}, "4 (policy p)"},
		{Limit{N: 5, Type: "quorum", Source: SourceArgument}, "5 (argument x-delivery-limit)"},
		{Limit{Type: "quorum", Source: SourceNone, Default4x: true}, "none (RabbitMQ 4.0+: 20)"},
		{Limit{Type: "classic", Source: SourceNone}, "none (classic queue)"},
	} {
		if got := tt.l.String(); got != tt.want {
			t.Errorf("%+v.String() = %q, want %q", tt.l, got, tt.want)
		}
	}
}

func TestNewRejectsAndRedacts(t *testing.T) {
	for _, raw := range []string{"amqp://u:s3cret@h:5672/", "http://u:s3cret@/x", "::"} {
		_, err := New(raw, nil)
		if !errors.Is(err, ErrInvalidURL) || !Permanent(err) {
			t.Fatalf("New(%q) = %v, want ErrInvalidURL", raw, err)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Fatalf("New(%q) error shows the password: %v", raw, err)
		}
	}
	c, err := New("https://u:s3cret@h:15672/prefix/", nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(c.String(), "s3cret") || c.base.String() != "https://h:15672/prefix" {
		t.Fatalf("client %s base %s", c, c.base.String())
	}
}

// FuzzResolve: whatever the API answers, parsing and resolving never
// panic, a limit comes with its source, and an error is ErrMalformed.
func FuzzResolve(f *testing.F) {
	for _, s := range []string{
		`{"type":"quorum","arguments":{"x-delivery-limit":5},"policy":"p","operator_policy":"o","effective_policy_definition":{"delivery-limit":3}}`,
		`{"type":"quorum","effective_policy_definition":[]}`,
		`{"type":"classic"}`,
		`{"arguments":{"x-delivery-limit":"x"}}`,
		`{"effective_policy_definition":{"delivery-limit":-1}}`,
		`null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		q, err := ParseQueue(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("ParseQueue error %v is not ErrMalformed", err)
			}
			return
		}
		l, err := Resolve(q)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Resolve error %v is not ErrMalformed", err)
			}
			return
		}
		if l.N < 0 {
			t.Fatalf("negative limit %+v", l)
		}
		if l.N > 0 && l.Source == SourceNone {
			t.Fatalf("limit %d without a source", l.N)
		}
		_ = l.String()
	})
}

func TestConsumerTimeout(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       time.Duration
		source     string
		ok, err    bool
	}{
		{"none", `{"name":"q","arguments":{},"effective_policy_definition":[]}`, 0, "", false, false},
		{"argument", `{"name":"q","arguments":{"x-consumer-timeout":8000},"effective_policy_definition":[]}`, 8 * time.Second, "argument x-consumer-timeout", true, false},
		{"the smaller: the policy", `{"name":"q","policy":"p","arguments":{"x-consumer-timeout":8000},"effective_policy_definition":{"consumer-timeout":1000}}`, time.Second, "policy p", true, false},
		{"the smaller: the argument", `{"name":"q","policy":"p","arguments":{"x-consumer-timeout":8000},"effective_policy_definition":{"consumer-timeout":60000}}`, 8 * time.Second, "argument x-consumer-timeout", true, false},
		{"policy", `{"name":"q","policy":"p","arguments":{},"effective_policy_definition":{"consumer-timeout":60000}}`, time.Minute, "policy p", true, false},
		{"not an integer", `{"name":"q","arguments":{"x-consumer-timeout":"soon"}}`, 0, "", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := ParseQueue([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			d, source, ok, err := ConsumerTimeout(q)
			if (err != nil) != tc.err || d != tc.want || source != tc.source || ok != tc.ok {
				t.Fatalf("ConsumerTimeout = %v %q %v %v, want %v %q %v (error %v)", d, source, ok, err, tc.want, tc.source, tc.ok, tc.err)
			}
		})
	}
}
