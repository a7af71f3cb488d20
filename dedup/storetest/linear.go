package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
// The model's expiry rule: none. Leases (a minute) and windows (an hour)
// outlast the run, so no record expires while it is checked; expiry is
// the model case's subject. A call that fails (a store error) may or may
// not have taken effect: the model allows both, from its invocation on.

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
	return p
}

type linInput struct {
	key   string
	op    stepKind
	owner string
}

type linOutput struct {
	result  string // acquired, in-flight, done, ok, lost
	unknown bool   // the call failed: it may or may not have taken effect
	err     string
}

type linState struct {
	kind  recKind
	owner string
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
		want, next := linStep(s, in)
		switch {
		case out.unknown:
			return []interface{}{s, next}
		case out.result == want:
			return []interface{}{next}
		}
		return nil
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
		return modelState{kind: s.kind, owner: s.owner}.String()
	},
}

// LinResult is what a linearizability run recorded and found.
type LinResult struct {
	Ops          int    // calls recorded
	Keys         int    // keys they went to
	Errors       int    // calls that failed (unknown outcome)
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
	)
	if p.Until != nil {
		rounds = 0
	}
	base := time.Now()
	now := func() int64 { return int64(time.Since(base)) } // monotonic
	prefix := fmt.Sprintf("lin:%s:%d", name, base.UnixNano())
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
				for i := 0; i < p.Ops; i++ {
					in := linInput{key: dedup.Key(prefix, "g", fmt.Sprintf("r%d-k%d", r, rng.IntN(p.Keys))), owner: owner}
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
					out := linCall(st, in)
					ret := now()
					if out.unknown {
						ret = math.MaxInt64 // it may take effect at any time after its call
					}
					mu.Lock()
					hist = append(hist, porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
					mu.Unlock()
					switch {
					case out.unknown:
						time.Sleep(p.ErrorPause)
					case p.Pace > 0:
						time.Sleep(p.Pace)
					}
				}
			}
		}()
	}
	wg.Wait()
	res := LinResult{Ops: len(hist), Keys: rounds * p.Keys}
	for _, op := range hist {
		if op.Output.(linOutput).unknown {
			res.Errors++
		}
	}
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

// linCall makes one call and turns its answer into the model's terms.
func linCall(st dedup.Store, in linInput) linOutput {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, _, err := callStore(ctx, st, in.op, in.key, in.owner, long, time.Hour)
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
