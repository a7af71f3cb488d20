package storetest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemq/idemq/dedup"
)

// The linearizability case: concurrent clients call Claim, Complete,
// Release and Extend on a few keys at a time, so they collide; every call
// is recorded with its invocation and return times and its answer, and the
// history is checked with porcupine against a model of the lease record
// (absent → processing(token) → done | absent). A history is linearizable
// when every call can be placed at one instant between its invocation and
// its return so that the sequence is one the model allows. Unlike the
// model case (RandomInterleavingsMatchTheModel: one call at a time), this
// finds what only concurrent callers see: a check and a write that are not
// atomic, an answer given for a state another caller already changed.
//
// The model's expiry rule. A lease granted by a call (a Claim acquired,
// an Extend) ends at the store's clock at the instant it applied the call
// plus the lease; that instant lies somewhere between the call's
// invocation and its return, so the end is known to lie in [invocation +
// lease, return + lease] (the test's and the store's clocks are the same
// machine's, give or take LinParams.Slack). A later call sees the record
// live, expired (absent), or either when its own interval overlaps that
// one; the model admits each side that explains the answer (a
// nondeterministic step), and porcupine keeps only the states that
// explain what follows. Windows (an hour) outlast the run: done records
// do not expire. With the default lease (a minute) nothing expires; with
// LinParams.Lease short and LinParams.Stall, clients that stall past
// their lease have it taken over, as a process stopped with SIGSTOP
// does. A call that fails (a store error) may or may not have taken
// effect: the model allows both, from its invocation on.

// LinParams sizes a linearizability run. The zero value is usable.
type LinParams struct {
	Clients int // concurrent callers, each with its own token; default 4
	Rounds  int // sets of fresh keys the clients go through; default 25
	Keys    int // keys per round; default 3
	Ops     int // calls per client per round; default 8
	// Pace is a pause between a client's calls (0: none), so that a
	// fault injected meanwhile lands among them.
	Pace time.Duration
	// ErrorPause is how long a client waits after a failed call before
	// its next one. Default 100ms: a call whose outcome is unknown may be
	// placed anywhere after its invocation, and each one doubles what the
	// checker may have to search in its key's history.
	ErrorPause time.Duration
	// Until, when set, makes the clients go on through fresh rounds until
	// it is closed (Rounds is then ignored): a fault test closes it once
	// its faults have run, however fast the machine is.
	Until <-chan struct{}
	// Lease is the lease of each Claim and Extend. Default a minute: no
	// lease ends during a run.
	Lease time.Duration
	// Stall, with StallPercent, makes a client stop for Stall after that
	// percentage of its acquired claims, as a process stopped with
	// SIGSTOP: longer than Lease, its lease ends and others take it over.
	// With Stall (and no Until) the clients start each round together, so
	// the others are on the stalled client's keys meanwhile (give Pace so
	// that a round outlasts a lease).
	Stall        time.Duration
	StallPercent int
	// Slack is the clock tolerance between the test and the store.
	// Default 25ms.
	Slack time.Duration
}

func (p LinParams) withDefaults() LinParams {
	if p.Clients <= 0 {
		p.Clients = 4
	}
	if p.Rounds <= 0 {
		p.Rounds = 25
	}
	if p.Keys <= 0 {
		p.Keys = 3
	}
	if p.Ops <= 0 {
		p.Ops = 8
	}
	if p.ErrorPause <= 0 {
		p.ErrorPause = 100 * time.Millisecond
	}
	if p.Lease <= 0 {
		p.Lease = long
	}
	if p.Slack <= 0 {
		p.Slack = 25 * time.Millisecond
	}
	return p
}

type linInput struct {
	key   string
	op    stepKind
	owner string
	// call and ret bound when the store applied the call (Unix ns; ret is
	// math.MaxInt64 when the call failed); lease and slack as LinParams.
	call, ret    int64
	lease, slack int64
}

type linOutput struct {
	result  string // acquired, in-flight, done, ok, lost
	unknown bool   // the call failed: it may or may not have taken effect
	err     string
}

type linState struct {
	kind  recKind
	owner string
	// lo, hi: a processing record's lease ends in [lo, hi] (Unix ns).
	lo, hi int64
}

// views returns what a call applied in [in.call, in.ret] may see of s: s
// while its lease may still run, absent once it may have ended.
func (in linInput) views(s linState) []linState {
	if s.kind != kProcessing {
		return []linState{s}
	}
	var out []linState
	if satAdd(in.ret, in.slack) >= s.lo { // may have ended
		out = append(out, linState{kind: kAbsent})
	}
	if in.call-in.slack < s.hi { // may still run
		out = append(out, s)
	}
	return out
}

// satAdd adds without overflowing past math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// linApply steps the viewed state v by in as the store contract says,
// with the lease interval of a lease the call granted.
func linApply(v linState, in linInput) (string, linState) {
	want, next := linStep(v, in)
	granted := (in.op == opClaim && want == "acquired") || (in.op == opExtend && want == "ok")
	switch {
	case granted:
		next.lo, next.hi = in.call+in.lease, satAdd(in.ret, in.lease)
	case next.kind == kProcessing:
		next.lo, next.hi = v.lo, v.hi
	default:
		next.lo, next.hi = 0, 0
	}
	return want, next
}

// linStep applies in to s as the store contract says: the answer and the
// state after it.
func linStep(s linState, in linInput) (string, linState) {
	mine := s.kind == kProcessing && s.owner == in.owner
	switch in.op {
	case opClaim:
		switch {
		case s.kind == kAbsent, mine:
			return "acquired", linState{kind: kProcessing, owner: in.owner}
		case s.kind == kDone:
			return "done", s
		default:
			return "in-flight", s
		}
	case opComplete:
		switch {
		case mine:
			return "ok", linState{kind: kDone}
		case s.kind == kProcessing:
			return "lost", s
		default: // absent (done is still recorded) or already done
			return "lost", linState{kind: kDone}
		}
	case opRelease:
		if mine {
			return "ok", linState{kind: kAbsent}
		}
		return "lost", s
	case opExtend:
		if mine {
			return "ok", s
		}
		return "lost", s
	}
	panic("storetest: unknown op")
}

var linOpNames = map[stepKind]string{opClaim: "Claim", opComplete: "Complete", opRelease: "Release", opExtend: "Extend"}

// LeaseModel is the porcupine model of one store's lease records,
// partitioned by key.
var LeaseModel = porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			k := op.Input.(linInput).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []interface{} { return []interface{}{linState{kind: kAbsent}} },
	Step: func(state, input, output interface{}) []interface{} {
		s, in, out := state.(linState), input.(linInput), output.(linOutput)
		var nexts []interface{}
		if out.unknown {
			nexts = append(nexts, s) // no effect
		}
		for _, v := range in.views(s) {
			want, next := linApply(v, in)
			if out.unknown || out.result == want {
				nexts = append(nexts, next)
			}
		}
		return nexts
	},
	Equal: func(a, b interface{}) bool { return a.(linState) == b.(linState) },
	DescribeOperation: func(input, output interface{}) string {
		in, out := input.(linInput), output.(linOutput)
		res := out.result
		if out.unknown {
			res = "error: " + out.err
		}
		return fmt.Sprintf("%s(%s) → %s", linOpNames[in.op], in.owner, res)
	},
	DescribeState: func(state interface{}) string {
		s := state.(linState)
		return modelState{kind: s.kind, owner: s.owner, lo: time.Unix(0, s.lo), hi: time.Unix(0, s.hi)}.String()
	},
}

// LinResult is what a linearizability run recorded and found.
type LinResult struct {
	Ops          int    // calls recorded
	Keys         int    // keys they went to
	Errors       int    // calls that failed (unknown outcome)
	Stalls       int    // client stalls (LinParams.Stall)
	TakenOver    int    // claims acquired on a key another client held (its lease ended), by the history's order
	Linearizable bool   // porcupine's verdict is Ok
	Verdict      string // "Ok", "Illegal" (not linearizable) or "Unknown" (the check timed out)
	Visualized   string // the HTML visualisation of a failed check ("" when it passed)
}

// CheckLinearizable runs concurrent clients on st as p says and checks the
// history. name names the visualisation written when the check fails
// (under the repository's .data/lincheck, else the test's temporary
// folder).
func CheckLinearizable(t testing.TB, st dedup.Store, name string, p LinParams) LinResult {
	t.Helper()
	p = p.withDefaults()
	var (
		mu     sync.Mutex
		hist   []porcupine.Operation
		wg     sync.WaitGroup
		rounds = p.Rounds // with Until: the most any client started
		stalls atomic.Int64
	)
	if p.Until != nil {
		rounds = 0
	}
	base := time.Now()
	wall := base.UnixNano()
	now := func() int64 { return wall + int64(time.Since(base)) } // the wall clock, advanced monotonically
	prefix := fmt.Sprintf("lin:%s:%d", name, base.UnixNano())
	var bar *barrier
	if p.Stall > 0 && p.Until == nil {
		bar = newBarrier(p.Clients)
	}
	for c := 0; c < p.Clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(base.UnixNano()), uint64(c)))
			owner := fmt.Sprintf("c%d", c)
			for r := 0; p.Until != nil || r < p.Rounds; r++ {
				if p.Until != nil {
					select {
					case <-p.Until:
						return
					default:
					}
					mu.Lock()
					rounds = max(rounds, r+1)
					mu.Unlock()
				}
				if bar != nil {
					bar.wait()
				}
				for i := 0; i < p.Ops; i++ {
					in := linInput{key: dedup.Key(prefix, "g", fmt.Sprintf("r%d-k%d", r, rng.IntN(p.Keys))), owner: owner,
						lease: int64(p.Lease), slack: int64(p.Slack)}
					// Claims most often: the other calls need a record.
					switch n := rng.IntN(10); {
					case n < 4:
						in.op = opClaim
					case n < 7:
						in.op = opComplete
					case n < 9:
						in.op = opRelease
					default:
						in.op = opExtend
					}
					call := now()
					out := linCall(st, in, p.Lease)
					ret := now()
					if out.unknown {
						ret = math.MaxInt64 // it may take effect at any time after its call
					}
					in.call, in.ret = call, ret
					mu.Lock()
					hist = append(hist, porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
					mu.Unlock()
					switch {
					case out.unknown:
						time.Sleep(p.ErrorPause)
					case p.Stall > 0 && out.result == "acquired" && rng.IntN(100) < p.StallPercent:
						time.Sleep(p.Stall)
						stalls.Add(1)
					case p.Pace > 0:
						time.Sleep(p.Pace)
					}
				}
			}
		}()
	}
	wg.Wait()
	res := LinResult{Ops: len(hist), Keys: rounds * p.Keys, Stalls: int(stalls.Load())}
	for _, op := range hist {
		if op.Output.(linOutput).unknown {
			res.Errors++
		}
	}
	res.TakenOver = takenOver(hist)
	model := LeaseModel.ToModel()
	verdict, info := porcupine.CheckOperationsVerbose(model, hist, time.Minute)
	res.Linearizable = verdict == porcupine.Ok
	res.Verdict = string(verdict)
	if !res.Linearizable {
		res.Visualized = visualPath(t, name)
		if err := porcupine.VisualizePath(model, info, res.Visualized); err != nil {
			t.Logf("storetest: could not write the visualisation: %v", err)
			res.Visualized = ""
		}
	}
	return res
}

// barrier lets n goroutines wait for each other, round after round.
type barrier struct {
	mu         sync.Mutex
	cond       *sync.Cond
	n, waiting int
	gen        int
}

func newBarrier(n int) *barrier {
	b := &barrier{n: n}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *barrier) wait() {
	b.mu.Lock()
	defer b.mu.Unlock()
	gen := b.gen
	if b.waiting++; b.waiting == b.n {
		b.waiting, b.gen = 0, b.gen+1
		b.cond.Broadcast()
		return
	}
	for gen == b.gen {
		b.cond.Wait()
	}
}

// takenOver counts the claims acquired on a key another client held by a
// claim it had acquired and not given up (Complete, Release) or lost, in
// the order of invocation: what only an ended lease allows.
func takenOver(hist []porcupine.Operation) int {
	ops := slices.Clone(hist)
	slices.SortStableFunc(ops, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	holder := map[string]string{}
	n := 0
	for _, op := range ops {
		in, out := op.Input.(linInput), op.Output.(linOutput)
		if out.unknown {
			delete(holder, in.key) // who holds it is not known
			continue
		}
		switch {
		case in.op == opClaim && out.result == "acquired":
			if h, ok := holder[in.key]; ok && h != in.owner {
				n++
			}
			holder[in.key] = in.owner
		case in.op == opComplete, in.op == opRelease && out.result == "ok":
			if holder[in.key] == in.owner {
				delete(holder, in.key)
			}
		case out.result == "lost" && holder[in.key] == in.owner:
			delete(holder, in.key)
		}
	}
	return n
}

// linCall makes one call and turns its answer into the model's terms.
func linCall(st dedup.Store, in linInput, lease time.Duration) linOutput {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, _, err := callStore(ctx, st, in.op, in.key, in.owner, lease, time.Hour)
	switch {
	case errors.Is(err, dedup.ErrLeaseLost):
		return linOutput{result: "lost"}
	case err != nil:
		return linOutput{unknown: true, err: err.Error()}
	case in.op != opClaim:
		return linOutput{result: "ok"}
	}
	switch c.Result {
	case dedup.Acquired:
		return linOutput{result: "acquired"}
	case dedup.InFlight:
		return linOutput{result: "in-flight"}
	case dedup.Done:
		return linOutput{result: "done"}
	}
	return linOutput{result: c.Result.String()}
}

// visualPath is where a failed check's visualisation goes: .data/lincheck
// of the repository the test runs in (found upwards from the working
// folder by its Makefile and go.mod), else the test's temporary folder.
func visualPath(t testing.TB, name string) string {
	file := strings.NewReplacer("/", "_", " ", "_", ":", "_").Replace(name) + "-" + time.Now().Format("20060102-150405") + ".html"
	dir, err := os.Getwd()
	for err == nil {
		_, e1 := os.Stat(filepath.Join(dir, "Makefile"))
		_, e2 := os.Stat(filepath.Join(dir, "go.mod"))
		if e1 == nil && e2 == nil {
			out := filepath.Join(dir, ".data", "lincheck")
			if os.MkdirAll(out, 0o755) == nil {
				return filepath.Join(out, file)
			}
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return filepath.Join(t.TempDir(), file)
}

// leasesEnd is the suite's case with leases that end: clients stall past
// their lease (s.Lease) after a quarter of their acquired claims, and the
// others take the key over.
func leasesEnd(t *testing.T, s Suite) {
	lease := s.Lease
	if lease <= 0 {
		lease = 300 * time.Millisecond
	}
	res := CheckLinearizable(t, s.New(t), t.Name(), LinParams{Rounds: 5, Ops: 8, Keys: 2, Pace: lease / 4,
		Lease: lease, Stall: 2 * lease, StallPercent: 25})
	t.Logf("%d calls by 4 clients on %d keys (2 at a time), lease %v, %d stalls of %v, %d claims taken over, %d failed: linearizable %v",
		res.Ops, res.Keys, lease, res.Stalls, 2*lease, res.TakenOver, res.Errors, res.Linearizable)
	if !res.Linearizable {
		t.Fatalf("the history is not linearizable: see %s", res.Visualized)
	}
	if res.Errors > 0 {
		t.Fatalf("%d calls failed on a healthy store", res.Errors)
	}
}

// linearizable is the suite's case: the store's history under concurrent
// callers is linearizable.
func linearizable(t *testing.T, s Suite) {
	res := CheckLinearizable(t, s.New(t), t.Name(), LinParams{})
	t.Logf("%d calls by 4 clients on %d keys (3 at a time), %d failed: linearizable %v", res.Ops, res.Keys, res.Errors, res.Linearizable)
	if !res.Linearizable {
		t.Fatalf("the history is not linearizable: see %s", res.Visualized)
	}
	if res.Errors > 0 {
		t.Fatalf("%d calls failed on a healthy store", res.Errors)
	}
}
