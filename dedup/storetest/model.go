package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
)

// The model case: random interleavings of Claim, Complete, Release, Extend
// (and Get, ClaimBatch, CompleteBatch where the store has them) by several
// owners on a few keys, with leases and windows that expire while the
// sequence runs, checked step by step against a reference model of the
// store contract (dedup.Store's doc). Seeded and reproducible: a failure
// prints the seed and the steps that led to it.
//
// Time is where real stores differ from a model: a store applies an
// operation at some instant between the call and its return, by its own
// clock, so a record's expiry is known only within an interval. The model
// never guesses. It keeps, per key, the set of states the store may be in;
// a step whose outcome depends on which side of an expiry the store was
// accepts either answer, and the answer then tells the model which side it
// was (states that could not have given it are dropped). A step fails only
// when no possible state explains the store's answer. Steps far from any
// expiry are exact.
//
// With Suite.NewClocked the store runs on a clock the test drives: many
// long sequences in no real time, expiry boundaries hit exactly. Without
// it, short real leases and real pauses (fewer, shorter sequences).

// modelParams sizes a model run.
type modelParams struct {
	seeds       int
	steps       int
	keys        int
	owners      int
	short, long time.Duration // lease/window lengths
	slack       time.Duration // clock tolerance between the test and the store
	pauses      int           // percent of steps that let time pass
}

type recKind int

const (
	kAbsent recKind = iota
	kProcessing
	kDone
)

// modelState is one state a record may be in: kind, owner (processing),
// and when it expires, known to lie in [lo, hi] (test clock).
type modelState struct {
	kind   recKind
	owner  string
	lo, hi time.Time
}

func (s modelState) String() string {
	switch s.kind {
	case kProcessing:
		return fmt.Sprintf("processing(%s)[%s..%s]", s.owner, s.lo.Format("05.000"), s.hi.Format("05.000"))
	case kDone:
		return fmt.Sprintf("done[%s..%s]", s.lo.Format("05.000"), s.hi.Format("05.000"))
	}
	return "absent"
}

// possible is the set of states a key may be in, merged per (kind, owner)
// by widening the expiry interval (sound: it only admits more).
type possible []modelState

func (p possible) add(s modelState) possible {
	for i, q := range p {
		if q.kind == s.kind && q.owner == s.owner {
			if s.kind != kAbsent {
				if s.lo.Before(q.lo) {
					p[i].lo = s.lo
				}
				if s.hi.After(q.hi) {
					p[i].hi = s.hi
				}
			}
			return p
		}
	}
	return append(p, s)
}

func (p possible) String() string {
	parts := make([]string, len(p))
	for i, s := range p {
		parts[i] = s.String()
	}
	return "{" + strings.Join(parts, " | ") + "}"
}

// window is when a step ran: the store applied it at some instant in
// [t0, t1] of the test clock, give or take slack.
type window struct {
	t0, t1 time.Time
	slack  time.Duration
}

// views returns what the store may see of s when it applies a step: s
// itself if it may still be live, absent if it may have expired.
func (w window) views(s modelState) []modelState {
	if s.kind == kAbsent {
		return []modelState{s}
	}
	var out []modelState
	if w.t1.Add(w.slack).After(s.lo) || w.t1.Add(w.slack).Equal(s.lo) { // may have expired
		out = append(out, modelState{kind: kAbsent})
	}
	if w.t0.Add(-w.slack).Before(s.hi) { // may still be live
		out = append(out, s)
	}
	return out
}

func (w window) expiring(d time.Duration) (time.Time, time.Time) {
	return w.t0.Add(d), w.t1.Add(d)
}

// stepKind is an operation of the model.
type stepKind int

const (
	opClaim stepKind = iota
	opComplete
	opRelease
	opExtend
	opGet
)

func (k stepKind) String() string {
	return [...]string{"Claim", "Complete", "Release", "Extend", "Get"}[k]
}

type step struct {
	op    stepKind
	key   int
	owner string
	d     time.Duration // lease or window
}

// answer is a store's answer to a step, in comparable form.
type answer struct {
	s         string        // "acquired", "in-flight", "done", "ok", "lost", "absent", "processing:<owner>", "done-record"
	leaseLeft time.Duration // in-flight only
}

// apply returns the answer the contract gives for st seen as v, and the
// states the record may be in after it. It returns ok=false when v cannot
// give the answer got (got is ignored when check is false).
func apply(st step, v modelState, w window, got answer) (want string, next []modelState, ok bool) {
	lo, hi := w.expiring(st.d)
	switch st.op {
	case opClaim:
		switch {
		case v.kind == kAbsent:
			return "acquired", []modelState{{kind: kProcessing, owner: st.owner, lo: lo, hi: hi}}, got.s == "acquired"
		case v.kind == kDone:
			return "done", []modelState{v}, got.s == "done"
		case v.owner == st.owner:
			// Idempotent for its owner; whether it renews is not specified.
			return "acquired", []modelState{v, {kind: kProcessing, owner: st.owner, lo: lo, hi: hi}}, got.s == "acquired"
		default:
			// LeaseLeft: 0 (the store cannot tell) or what the lease has left.
			left := got.leaseLeft
			okLeft := left == 0 || (left > 0 && left <= v.hi.Sub(w.t0)+w.slack)
			return "in-flight", []modelState{v}, got.s == "in-flight" && okLeft
		}
	case opComplete:
		switch {
		case v.kind == kProcessing && v.owner == st.owner:
			return "ok", []modelState{{kind: kDone, lo: lo, hi: hi}}, got.s == "ok"
		case v.kind == kProcessing:
			return "lost", []modelState{v}, got.s == "lost"
		case v.kind == kAbsent:
			// Lost, but done is recorded: the effect was applied.
			return "lost", []modelState{{kind: kDone, lo: lo, hi: hi}}, got.s == "lost"
		default:
			// Already done: lost; the window may or may not start again.
			return "lost", []modelState{v, {kind: kDone, lo: lo, hi: hi}}, got.s == "lost"
		}
	case opRelease:
		if v.kind == kProcessing && v.owner == st.owner {
			return "ok", []modelState{{kind: kAbsent}}, got.s == "ok"
		}
		return "lost", []modelState{v}, got.s == "lost"
	case opExtend:
		if v.kind == kProcessing && v.owner == st.owner {
			return "ok", []modelState{{kind: kProcessing, owner: st.owner, lo: lo, hi: hi}}, got.s == "ok"
		}
		return "lost", []modelState{v}, got.s == "lost"
	case opGet:
		switch v.kind {
		case kAbsent:
			return "absent", []modelState{v}, got.s == "absent"
		case kProcessing:
			return "processing:" + v.owner, []modelState{v}, got.s == "processing:"+v.owner
		default:
			return "done-record", []modelState{v}, got.s == "done-record"
		}
	}
	panic("unknown op")
}

// modelClock is the test's clock: real, or driven by the test.
type modelClock struct {
	mu   sync.Mutex
	fake bool
	now  time.Time
}

func (c *modelClock) Now() time.Time {
	if !c.fake {
		return time.Now()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// advance moves the fake clock by d, or lets d of real time pass.
func (c *modelClock) advance(d time.Duration) {
	if !c.fake {
		// Not a wait for something: the model's time passing, so that
		// leases and windows expire between steps.
		time.Sleep(d)
		return
	}
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// modelRun drives one seeded sequence against st and the model.
type modelRun struct {
	t      *testing.T
	seed   uint64
	st     dedup.Store
	clock  *modelClock
	p      modelParams
	rng    *rand.Rand
	keys   []string
	states []possible
	log    []string

	// What the run exercised (logged): steps that met a record the store
	// may have expired (ambiguous) and answers only an expired record
	// explains or admits (expired), and the answers by kind.
	ambiguous, expired int
	answers            map[string]int
}

func (r *modelRun) fail(format string, args ...any) {
	r.t.Helper()
	tail := r.log
	if len(tail) > 25 {
		tail = tail[len(tail)-25:]
	}
	r.t.Fatalf("model (seed %d, %d steps in): %s\nlast steps:\n  %s", r.seed, len(r.log), fmt.Sprintf(format, args...), strings.Join(tail, "\n  "))
}

func toAnswer(r *modelRun, op stepKind, c dedup.Claim, rec dedup.Record, found bool, err error) answer {
	r.t.Helper()
	if err != nil {
		if errors.Is(err, dedup.ErrLeaseLost) && op != opClaim && op != opGet {
			return answer{s: "lost"}
		}
		r.fail("%v: unexpected error %v", op, err)
	}
	switch op {
	case opClaim:
		switch c.Result {
		case dedup.Acquired:
			return answer{s: "acquired"}
		case dedup.InFlight:
			return answer{s: "in-flight", leaseLeft: c.LeaseLeft}
		case dedup.Done:
			return answer{s: "done"}
		}
		r.fail("Claim: unknown result %v", c.Result)
	case opGet:
		switch {
		case !found:
			return answer{s: "absent"}
		case rec.State == dedup.StateProcessing:
			return answer{s: "processing:" + rec.Owner}
		case rec.State == dedup.StateDone:
			return answer{s: "done-record"}
		}
		r.fail("Get: unknown state %q", rec.State)
	}
	return answer{s: "ok"}
}

// check folds the store's answer to one step into the model.
func (r *modelRun) check(st step, w window, got answer) {
	r.t.Helper()
	var next possible
	var wants []string
	for _, s := range r.states[st.key] {
		views := w.views(s)
		if len(views) > 1 {
			r.ambiguous++
		}
		for _, v := range views {
			want, after, ok := apply(st, v, w, got)
			wants = append(wants, want)
			if ok {
				if s.kind != kAbsent && v.kind == kAbsent {
					r.expired++
				}
				for _, a := range after {
					next = next.add(a)
				}
			}
		}
	}
	r.answers[st.op.String()+" "+got.s]++
	line := fmt.Sprintf("%-8v k%d %s d=%v → %s (LeaseLeft %v) at %s..%s; model was %v",
		st.op, st.key, st.owner, st.d, got.s, got.leaseLeft, w.t0.Format("05.000"), w.t1.Format("05.000"), r.states[st.key])
	r.log = append(r.log, line)
	if len(next) == 0 {
		slices.Sort(wants)
		r.fail("%v of key %d by %s answered %q (LeaseLeft %v); the contract allows %v from %v",
			st.op, st.key, st.owner, got.s, got.leaseLeft, slices.Compact(wants), r.states[st.key])
	}
	r.states[st.key] = next
}

func (r *modelRun) randomStep() step {
	st := step{key: r.rng.IntN(r.p.keys), owner: fmt.Sprintf("o%d", r.rng.IntN(r.p.owners))}
	switch n := r.rng.IntN(100); {
	case n < 40:
		st.op = opClaim
	case n < 55:
		st.op = opComplete
	case n < 70:
		st.op = opRelease
	case n < 90:
		st.op = opExtend
	default:
		st.op = opGet
	}
	// Mostly the holder completes, releases, extends (the guard's own
	// calls); the rest are late or stray owners.
	if st.op != opClaim && r.rng.IntN(100) < 60 {
		for _, s := range r.states[st.key] {
			if s.kind == kProcessing {
				st.owner = s.owner
			}
		}
	}
	// Mostly short leases and windows, so that records come and go; some
	// long ones, which no pause outlives.
	st.d = r.p.short
	if r.rng.IntN(100) < 30 {
		st.d = r.p.long
	}
	return st
}

func (r *modelRun) single(ctx context.Context, st step) {
	r.t.Helper()
	k := r.keys[st.key]
	t0 := r.clock.Now()
	c, rec, found, err := callStore(ctx, r.st, st.op, k, st.owner, st.d, st.d)
	w := window{t0: t0, t1: r.clock.Now(), slack: r.p.slack}
	r.check(st, w, toAnswer(r, st.op, c, rec, found, err))
}

// callStore makes one call of op on st: lease for Claim and Extend,
// window for Complete (the model case and the linearizability case).
func callStore(ctx context.Context, st dedup.Store, op stepKind, k, owner string, lease, window time.Duration) (c dedup.Claim, rec dedup.Record, found bool, err error) {
	switch op {
	case opClaim:
		c, err = st.Claim(ctx, k, owner, lease)
	case opComplete:
		err = st.Complete(ctx, k, owner, window)
	case opRelease:
		err = st.Release(ctx, k, owner)
	case opExtend:
		err = st.Extend(ctx, k, owner, lease)
	case opGet:
		rec, found, err = st.(dedup.Inspector).Get(ctx, k)
	}
	return c, rec, found, err
}

// batch sends 1–3 claims (or completes) in one batch call; the store
// answers each as the single call would, in order.
func (r *modelRun) batch(ctx context.Context, bs dedup.BatchStore, op stepKind) {
	r.t.Helper()
	steps := make([]step, 1+r.rng.IntN(3))
	for i := range steps {
		steps[i] = r.randomStep()
		steps[i].op = op
	}
	t0 := r.clock.Now()
	var answers []answer
	if op == opClaim {
		reqs := make([]dedup.ClaimRequest, len(steps))
		for i, st := range steps {
			reqs[i] = dedup.ClaimRequest{Key: r.keys[st.key], Token: st.owner, Lease: st.d}
		}
		reps := bs.ClaimBatch(ctx, reqs)
		if len(reps) != len(reqs) {
			r.fail("ClaimBatch answered %d of %d", len(reps), len(reqs))
		}
		for _, rep := range reps {
			answers = append(answers, toAnswer(r, opClaim, rep.Claim, dedup.Record{}, false, rep.Err))
		}
	} else {
		reqs := make([]dedup.CompleteRequest, len(steps))
		for i, st := range steps {
			reqs[i] = dedup.CompleteRequest{Key: r.keys[st.key], Token: st.owner, Window: st.d}
		}
		errs := bs.CompleteBatch(ctx, reqs)
		if len(errs) != len(reqs) {
			r.fail("CompleteBatch answered %d of %d", len(errs), len(reqs))
		}
		for _, err := range errs {
			answers = append(answers, toAnswer(r, opComplete, dedup.Claim{}, dedup.Record{}, false, err))
		}
	}
	w := window{t0: t0, t1: r.clock.Now(), slack: r.p.slack}
	r.log = append(r.log, fmt.Sprintf("batch of %d:", len(steps)))
	for i, st := range steps {
		r.check(st, w, answers[i])
	}
}

// mixedBatch sends 1–4 claims and completes in one Batch call; the store
// answers each as the single call would, claims first, each kind in order.
func (r *modelRun) mixedBatch(ctx context.Context, ms dedup.MixedBatchStore) {
	r.t.Helper()
	var claims, completes []step
	for range 1 + r.rng.IntN(4) {
		st := r.randomStep()
		if r.rng.IntN(2) == 0 {
			st.op = opClaim
			claims = append(claims, st)
		} else {
			st.op = opComplete
			completes = append(completes, st)
		}
	}
	creqs := make([]dedup.ClaimRequest, len(claims))
	for i, st := range claims {
		creqs[i] = dedup.ClaimRequest{Key: r.keys[st.key], Token: st.owner, Lease: st.d}
	}
	dreqs := make([]dedup.CompleteRequest, len(completes))
	for i, st := range completes {
		dreqs[i] = dedup.CompleteRequest{Key: r.keys[st.key], Token: st.owner, Window: st.d}
	}
	t0 := r.clock.Now()
	reps, errs := ms.Batch(ctx, creqs, dreqs)
	w := window{t0: t0, t1: r.clock.Now(), slack: r.p.slack}
	if len(reps) != len(creqs) || len(errs) != len(dreqs) {
		r.fail("Batch answered %d of %d claims, %d of %d completes", len(reps), len(creqs), len(errs), len(dreqs))
		return
	}
	r.log = append(r.log, fmt.Sprintf("mixed batch of %d claims, %d completes:", len(claims), len(completes)))
	for i, st := range claims {
		r.check(st, w, toAnswer(r, opClaim, reps[i].Claim, dedup.Record{}, false, reps[i].Err))
	}
	for i, st := range completes {
		r.check(st, w, toAnswer(r, opComplete, dedup.Claim{}, dedup.Record{}, false, errs[i]))
	}
}

// pause lets time pass: mostly a little, sometimes past a short lease, on
// a fake clock sometimes exactly onto an expiry (the boundary itself).
func (r *modelRun) pause() {
	switch n := r.rng.IntN(100); {
	case r.clock.fake && n < 10:
		// Exactly onto the earliest expiry ahead, if any.
		now := r.clock.Now()
		var next time.Time
		for _, p := range r.states {
			for _, s := range p {
				if s.kind != kAbsent && s.lo.After(now) && (next.IsZero() || s.lo.Before(next)) {
					next = s.lo
				}
			}
		}
		if !next.IsZero() {
			r.clock.advance(next.Sub(now))
		}
	case n < 25:
		r.clock.advance(r.p.short + r.p.short/4 + r.p.slack)
	default:
		r.clock.advance(time.Duration(r.rng.Int64N(int64(r.p.short / 4))))
	}
}

func runModel(t *testing.T, newStore func(t *testing.T, clock *modelClock) dedup.Store, fake bool, p modelParams) {
	// One store for every seed (a fresh SQL database takes seconds); each
	// seed has its own keys.
	clock := &modelClock{fake: fake, now: time.Unix(1_000_000, 0)}
	st := newStore(t, clock)
	var ambiguous, expired int
	answers := map[string]int{}
	defer func() {
		t.Logf("%d seeds × %d steps: %d steps near an expiry, %d answers from an expired record; answers: %v",
			p.seeds, p.steps, ambiguous, expired, answers)
	}()
	for seed := uint64(1); seed <= uint64(p.seeds); seed++ {
		r := &modelRun{
			t: t, seed: seed, st: st, clock: clock, p: p,
			rng:    rand.New(rand.NewPCG(seed, seed*0x9e3779b97f4a7c15)),
			states: make([]possible, p.keys), answers: answers,
		}
		for i := range p.keys {
			r.keys = append(r.keys, fmt.Sprintf("model:%s:s%d:k%d", t.Name(), seed, i))
			r.states[i] = possible{{kind: kAbsent}}
		}
		_, inspect := st.(dedup.Inspector)
		bs, batches := st.(dedup.BatchStore)
		ms, mixed := st.(dedup.MixedBatchStore)
		c := ctx(t)
		for i := 0; i < p.steps; i++ {
			switch n := r.rng.IntN(100); {
			case n < p.pauses:
				r.pause()
			case batches && n < p.pauses+5:
				r.batch(c, bs, opClaim)
			case batches && n < p.pauses+8:
				r.batch(c, bs, opComplete)
			case mixed && n < p.pauses+12:
				r.mixedBatch(c, ms)
			default:
				st := r.randomStep()
				if st.op == opGet && !inspect {
					st.op = opClaim
				}
				r.single(c, st)
			}
		}
		ambiguous, expired = ambiguous+r.ambiguous, expired+r.expired
	}
}

// modelRandom: the model case as the suite runs it.
func modelRandom(t *testing.T, s Suite) {
	if s.NewClocked != nil {
		t.Run("FakeClock", func(t *testing.T) {
			runModel(t, func(t *testing.T, c *modelClock) dedup.Store { return s.NewClocked(t, c.Now) }, true, modelParams{
				seeds: 200, steps: 300, keys: 3, owners: 3,
				short: time.Second, long: 10 * time.Second, pauses: 15,
			})
		})
	}
	t.Run("RealClock", func(t *testing.T) {
		runModel(t, func(t *testing.T, _ *modelClock) dedup.Store { return s.New(t) }, false, modelParams{
			seeds: 2, steps: 80, keys: 3, owners: 3,
			short: s.Lease, long: time.Minute, slack: 25 * time.Millisecond, pauses: 8,
		})
	})
}
