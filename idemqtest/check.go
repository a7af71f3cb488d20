package idemqtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
)

// Target is what [Check] runs one scenario on: a fresh pipeline over fresh
// state, and how to read that state.
type Target struct {
	// Pipeline is the user's pipeline: policy, middleware, guard, handler
	// (or an inbox's handler). Required.
	Pipeline idemq.Pipeline
	// Applied reads the observable effect of message m and says how many
	// times it was applied (a balance divided by the amount, rows in a
	// table). Required.
	Applied func(ctx context.Context, m idemq.Message) (int, error)
	// Clock, when set, is the clock of the target's dedup store
	// ([NewStore]): when only deferred deliveries are left (a lease nobody
	// will complete), the kit advances it by their delay, as time would.
	Clock *Clock
	// Close, when set, is called once the scenario is judged.
	Close func() error
}

// Setup builds a fresh [Target] for one scenario (its name says which).
// Every scenario starts from nothing, so a verdict is never a neighbour's.
type Setup func(ctx context.Context, scenario string) (Target, error)

// Options tune [Check]. The zero value is usable.
type Options struct {
	// Copies is how many times each message is delivered (published
	// several times, or redelivered), shuffled and concurrent. Default 3.
	Copies int
	// Workers run deliveries concurrently. Default 4.
	Workers int
	// Points are the crash points simulated, one scenario each, after a
	// scenario without crashes ("duplicates"). Default [AllPoints].
	Points []Point
	// Crashes is how many deliveries of each message crash at the point
	// of a scenario. Default 1.
	Crashes int
	// Seed of the shuffle; the report names it, so a failure can be
	// replayed. Default: random.
	Seed uint64
	// ID decides the deliveries' IDs as the consumer's IDConfig does.
	ID idemq.IDConfig
	// Queue and Group of the deliveries. Default "idemqtest".
	Queue, Group string
	// MaxDeliveries bounds the deliveries of one message in a scenario
	// (a requeue loop is reported as stuck). Default 100.
	MaxDeliveries int
	// Timeout bounds one scenario. Default 1 minute.
	Timeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.Copies <= 0 {
		o.Copies = 3
	}
	if o.Workers <= 0 {
		o.Workers = 4
	}
	if o.Points == nil {
		o.Points = AllPoints
	}
	if o.Crashes <= 0 {
		o.Crashes = 1
	}
	if o.Seed == 0 {
		o.Seed = rand.Uint64() | 1
	}
	if o.Queue == "" {
		o.Queue = "idemqtest"
	}
	if o.Group == "" {
		o.Group = o.Queue
	}
	if o.MaxDeliveries <= 0 {
		o.MaxDeliveries = 100
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Minute
	}
	return o
}

// Kind is what went wrong with a message.
type Kind string

const (
	// AppliedTwice: the effect was applied more than once.
	AppliedTwice Kind = "applied-more-than-once"
	// Lost: the effect was never applied, and the message was not
	// dead-lettered or rejected either.
	Lost Kind = "lost"
	// Stuck: the message was still being redelivered at MaxDeliveries or
	// at the scenario's Timeout.
	Stuck Kind = "stuck"
)

// Trace is one delivery of a message in a scenario.
type Trace struct {
	Attempt     int    // 1-based, per message
	Redelivered bool   // the Redelivered flag it carried
	Crashed     Point  // where it crashed ("" did not)
	Decision    string // the decision taken (when it did not crash first)
}

// Violation is one message the kit found not idempotent.
type Violation struct {
	Scenario  string
	Kind      Kind
	MessageID string
	Applied   int
	// Point and Attempt: the crash that preceded it (Point "" when none:
	// the duplicates alone did it), and the attempt that crashed.
	Point   Point
	Attempt int
	Trace   []Trace
}

func (v Violation) String() string {
	s := fmt.Sprintf("%s: message %q %s (applied %d times)", v.Scenario, v.MessageID, v.Kind, v.Applied)
	if v.Point != "" {
		s += fmt.Sprintf(" after a crash at %s on attempt %d", v.Point, v.Attempt)
	}
	return s
}

// Scenario is one run of the messages.
type Scenario struct {
	Name  string
	Point Point // "" for the duplicates-only run
	// Reached says the crash point was hit at least once (InHandler needs
	// the handler's [CrashPoint] call).
	Reached    bool
	Deliveries int
	Crashes    int
	// Outcomes counts the settled decisions by outcome.
	Outcomes map[string]int
}

// Report is the verdict of [Check].
type Report struct {
	Seed       uint64
	Scenarios  []Scenario
	Violations []Violation
}

// Idempotent reports whether no message was applied more than once, lost
// or stuck.
func (r *Report) Idempotent() bool { return len(r.Violations) == 0 }

// Has reports whether a violation of kind k happened in the scenario of
// point p ("" : the duplicates-only scenario).
func (r *Report) Has(k Kind, p Point) bool {
	for _, v := range r.Violations {
		if v.Kind == k && v.Point == p {
			return true
		}
	}
	return false
}

// Points returns the crash points whose scenario had a violation of kind k.
func (r *Report) Points(k Kind) []Point {
	seen := map[Point]bool{}
	var ps []Point
	for _, s := range r.Scenarios {
		for _, v := range r.Violations {
			if v.Kind == k && v.Scenario == s.Name && !seen[s.Point] {
				seen[s.Point] = true
				ps = append(ps, s.Point)
			}
		}
	}
	return ps
}

func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "idemqtest: seed %d\n", r.Seed)
	for _, s := range r.Scenarios {
		n := 0
		for _, v := range r.Violations {
			if v.Scenario == s.Name {
				n++
			}
		}
		fmt.Fprintf(&b, "  scenario %-13s deliveries %3d crashes %2d violations %d", s.Name, s.Deliveries, s.Crashes, n)
		if s.Point != "" && !s.Reached {
			b.WriteString(" (crash point never reached)")
		}
		b.WriteString("\n")
	}
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "  %s\n", v)
		for _, t := range v.Trace {
			fmt.Fprintf(&b, "      attempt %d redelivered=%v", t.Attempt, t.Redelivered)
			if t.Crashed != "" {
				fmt.Fprintf(&b, " crashed at %s", t.Crashed)
			} else {
				fmt.Fprintf(&b, " %s", t.Decision)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// CheckIdempotent runs [Check] and fails t, with the report, when a message
// was applied more than once, lost or stuck. It logs a scenario whose
// crash point was never reached.
func CheckIdempotent(t testing.TB, setup Setup, msgs []idemq.Message, opts Options) *Report {
	t.Helper()
	r, err := Check(t.Context(), setup, msgs, opts)
	if err != nil {
		t.Fatalf("idemqtest: %v", err)
	}
	for _, s := range r.Scenarios {
		if s.Point != "" && !s.Reached {
			t.Logf("idemqtest: crash point %s never reached (call idemqtest.CrashPoint(ctx, %q) in the handler, or wrap an inbox handler in idemqtest.BeforeCommit)", s.Point, s.Point)
		}
	}
	if !r.Idempotent() {
		t.Errorf("idemqtest: handler is not idempotent:\n%s", r)
	}
	return r
}

// Check runs the messages through a fresh target once without crashes
// ("duplicates": each message delivered Copies times, shuffled, on Workers
// goroutines) and once per crash point (the same, and each message's first
// Crashes deliveries to reach the point crash there and are redelivered),
// then reads each message's effect and reports the ones applied more than
// once, lost or stuck. An error is a broken setup, not a verdict.
func Check(ctx context.Context, setup Setup, msgs []idemq.Message, opts Options) (*Report, error) {
	opts = opts.withDefaults()
	if len(msgs) == 0 {
		return nil, errors.New("no messages")
	}
	r := &Report{Seed: opts.Seed}
	points := append([]Point{""}, opts.Points...)
	for i, p := range points {
		name := string(p)
		if p == "" {
			name = "duplicates"
		}
		tg, err := setup(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("setup %s: %w", name, err)
		}
		if tg.Pipeline.Handler == nil || tg.Applied == nil {
			return nil, fmt.Errorf("setup %s: Target.Pipeline.Handler and Target.Applied are required", name)
		}
		sc := &scenario{opts: opts, name: name, point: p, tg: tg, rnd: rand.New(rand.NewPCG(opts.Seed, uint64(i)))}
		s, vs, err := sc.run(ctx, msgs)
		if tg.Close != nil {
			if cerr := tg.Close(); err == nil && cerr != nil {
				err = fmt.Errorf("close %s: %w", name, cerr)
			}
		}
		if err != nil {
			return nil, err
		}
		r.Scenarios = append(r.Scenarios, s)
		r.Violations = append(r.Violations, vs...)
	}
	return r, nil
}

// msgState is one message in a scenario.
type msgState struct {
	m        idemq.Message
	budget   atomic.Int32 // crashes left
	attempts atomic.Int32
	mu       sync.Mutex
	trace    []Trace
	crashAt  int  // attempt that crashed first
	settled  bool // a copy was dead-lettered or rejected
	stuck    bool
}

func (ms *msgState) add(t Trace) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	ms.trace = append(ms.trace, t)
	if t.Crashed != "" && ms.crashAt == 0 {
		ms.crashAt = t.Attempt
	}
}

// item is a delivery waiting in the kit's queue.
type item struct {
	ms          *msgState
	m           idemq.Message
	redelivered bool
}

type scenario struct {
	opts  Options
	name  string
	point Point
	tg    Target
	rnd   *rand.Rand

	mu       sync.Mutex
	cond     *sync.Cond
	ready    []item
	waiting  []item // deferred: back when something else settles
	maxDelay time.Duration
	inflight int

	reached  atomic.Bool
	delivers atomic.Int32
	crashes  atomic.Int32
	outMu    sync.Mutex
	outcomes map[string]int
}

// put queues it at a random place (the broker's order is not promised).
func (s *scenario) put(it item) {
	i := s.rnd.IntN(len(s.ready) + 1)
	s.ready = append(s.ready, item{})
	copy(s.ready[i+1:], s.ready[i:])
	s.ready[i] = it
}

func (s *scenario) run(ctx context.Context, msgs []idemq.Message) (Scenario, []Violation, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	s.cond = sync.NewCond(&s.mu)
	s.outcomes = map[string]int{}
	states := make([]*msgState, len(msgs))
	for i, m := range msgs {
		ms := &msgState{m: m}
		if s.point != "" {
			ms.budget.Store(int32(s.opts.Crashes))
		}
		states[i] = ms
		for range s.opts.Copies {
			s.put(item{ms: ms, m: m})
		}
	}
	stop := context.AfterFunc(ctx, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer stop()
	var wg sync.WaitGroup
	for range s.opts.Workers {
		wg.Go(func() { s.work(ctx) })
	}
	wg.Wait()
	s.mu.Lock()
	for _, it := range append(s.ready, s.waiting...) {
		it.ms.stuck = true
	}
	s.mu.Unlock()

	sc := Scenario{Name: s.name, Point: s.point, Reached: s.reached.Load(), Deliveries: int(s.delivers.Load()),
		Crashes: int(s.crashes.Load()), Outcomes: s.outcomes}
	var vs []Violation
	rctx := context.WithoutCancel(ctx)
	for _, ms := range states {
		n, err := s.tg.Applied(rctx, ms.m)
		if err != nil {
			return sc, nil, fmt.Errorf("%s: read the effect of %q: %w", s.name, ms.m.ID, err)
		}
		var kind Kind
		switch {
		case n > 1:
			kind = AppliedTwice
		case ms.stuck:
			kind = Stuck
		case n == 0 && !ms.settled:
			kind = Lost
		default:
			continue
		}
		slices.SortStableFunc(ms.trace, func(a, b Trace) int { return a.Attempt - b.Attempt })
		v := Violation{Scenario: s.name, Kind: kind, MessageID: ms.m.ID, Applied: n, Trace: ms.trace}
		if ms.crashAt > 0 {
			v.Point, v.Attempt = s.point, ms.crashAt
		}
		vs = append(vs, v)
	}
	return sc, vs, nil
}

// take returns the next delivery, or false when the scenario is over.
func (s *scenario) take(ctx context.Context) (item, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if ctx.Err() != nil {
			return item{}, false
		}
		if len(s.ready) > 0 {
			it := s.ready[0]
			s.ready = s.ready[1:]
			s.inflight++
			return it, true
		}
		if s.inflight == 0 {
			if len(s.waiting) == 0 {
				return item{}, false
			}
			// Only deferred deliveries are left: their time has come
			// (a lease nobody renews expires).
			if s.tg.Clock != nil {
				s.tg.Clock.Advance(s.maxDelay)
			}
			s.release()
			continue
		}
		s.cond.Wait()
	}
}

// release puts the deferred deliveries back (called with mu held).
func (s *scenario) release() {
	for _, it := range s.waiting {
		s.put(it)
	}
	s.waiting, s.maxDelay = nil, 0
	s.cond.Broadcast()
}

// done ends an attempt; next is what goes back to the queue, deferred or
// not.
func (s *scenario) done(next []item, deferred bool, delay time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight--
	if deferred {
		s.waiting = append(s.waiting, next...)
		s.maxDelay = max(s.maxDelay, delay)
	} else {
		for _, it := range next {
			s.put(it)
		}
		// Something settled: the deferred may now get through.
		s.release()
	}
	s.cond.Broadcast()
}

func (s *scenario) work(ctx context.Context) {
	for {
		it, ok := s.take(ctx)
		if !ok {
			return
		}
		next, deferred, delay := s.deliver(ctx, it)
		s.done(next, deferred, delay)
	}
}

// deliver runs one delivery and carries its decision out, as the
// consumer's executor would on a broker: what it returns goes back to the
// queue.
func (s *scenario) deliver(ctx context.Context, it item) (next []item, deferred bool, delay time.Duration) {
	ms := it.ms
	n := int(ms.attempts.Add(1))
	if n > s.opts.MaxDeliveries {
		ms.mu.Lock()
		ms.stuck = true
		ms.mu.Unlock()
		return nil, false, 0
	}
	s.delivers.Add(1)
	d := s.delivery(it, n)
	a := &attempt{point: s.point, budget: &ms.budget, reached: &s.reached}
	actx := context.WithValue(idemq.WithRecorder(ctx, &idemq.Counters{}), attemptKey{}, a)
	again := item{ms: ms, m: it.m, redelivered: true}
	crashed := func(p Point) ([]item, bool, time.Duration) {
		s.crashes.Add(1)
		ms.add(Trace{Attempt: n, Redelivered: it.redelivered, Crashed: p})
		return []item{again}, false, 0
	}
	if crash(actx, BeforeClaim) {
		return crashed(BeforeClaim)
	}
	p := s.tg.Pipeline
	h := p.Handler
	p.Handler = idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		err := h.Handle(ctx, d)
		if err == nil {
			CrashPoint(ctx, AfterCommit)
		}
		return err
	})
	var dec idemq.Decision
	finished := make(chan bool, 1)
	go func() {
		ok := false
		defer func() { finished <- ok }()
		dec = p.Decide(actx, d)
		ok = true
	}()
	if !<-finished || a.crashed.Load() && a.point != BeforeAck {
		return crashed(a.point)
	}
	s.outMu.Lock()
	s.outcomes[dec.Outcome.String()]++
	s.outMu.Unlock()
	// The executor: publish first (confirmed), then settle.
	var out []item
	if dec.Action == idemq.ActionPublish && dec.Message != nil {
		switch dec.Outcome {
		case idemq.OutcomeDeadLettered, idemq.OutcomeRouted, idemq.OutcomeRejected:
			ms.mu.Lock()
			ms.settled = true
			ms.mu.Unlock()
		default: // a retry or a deferral through a retry queue: back later
			out = append(out, item{ms: ms, m: *dec.Message})
		}
	}
	if crash(actx, BeforeAck) {
		_, _, _ = crashed(BeforeAck)
		return append(out, again), false, 0
	}
	ms.add(Trace{Attempt: n, Redelivered: it.redelivered, Decision: dec.String()})
	switch dec.Action {
	case idemq.ActionReject:
		ms.mu.Lock()
		ms.settled = true
		ms.mu.Unlock()
	case idemq.ActionRequeue:
		return append(out, again), dec.Delay > 0, dec.Delay
	}
	return out, false, 0
}

// delivery builds the delivery of it as the consumer would.
func (s *scenario) delivery(it item, _ int) *idemq.Delivery {
	m := it.m
	h := amqp.Table{}
	for k, v := range m.Headers {
		h[k] = v
	}
	d := &idemq.Delivery{
		MessageID: m.ID, Body: m.Body, Headers: h, ContentType: m.ContentType, Type: m.Type,
		CorrelationID: m.CorrelationID, Exchange: m.Exchange, RoutingKey: m.RoutingKey,
		Queue: s.opts.Queue, Group: s.opts.Group, Redelivered: it.redelivered, ReceivedAt: time.Now(),
	}
	if d.RoutingKey == "" {
		d.RoutingKey = s.opts.Queue
	}
	s.opts.ID.Apply(d)
	return d
}
