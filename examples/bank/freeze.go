package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/idemq/idemq"
)

// freezeArmWait is how long the demo waits for an armed consumer to stop
// itself in a handler before it stops it where it is. Longer than the
// consumer's freezeArmWindow: once the demo gives up, the hook can no
// longer fire.
const freezeArmWait = freezeArmWindow + time.Second

// freezeResult is what one freeze did.
type freezeResult struct {
	// frozen: a consumer was stopped and continued.
	frozen bool
	// midHandler: it stopped itself at its in-handler point (effect
	// written, transaction open, dedup lease held), not idle.
	midHandler bool
	// leasesLost is the increase of its leases_lost counter seen after
	// the thaw (dedup modes).
	leasesLost int64
}

// freezeOne freezes one running consumer for dur: it arms the consumer's
// freeze hook (SIGUSR1), waits for the consumer to stop itself (SIGSTOP)
// in its next handler — or stops it where it is after freezeArmWait —
// then continues it (SIGCONT) after dur. armed is called once the
// consumer is armed. With leases set (a dedup mode)
// it then waits up to a few seconds for the consumer to report the leases
// it lost meanwhile. A consumer that dies while frozen (a kill) ends the
// freeze early; one that dies before it stopped is replaced by another.
func (s *supervisor) freezeOne(ctx context.Context, rng *rand.Rand, dur time.Duration, leases bool, armed func()) freezeResult {
	// A consumer armed for a freeze may die before it stops (a kill, a
	// crash point: at --crash-rate 0.002 a busy consumer dies every few
	// seconds): then another one is armed.
	var whys []string
	for attempt := 0; attempt < freezeAttempts && ctx.Err() == nil; attempt++ {
		res, why := s.tryFreeze(ctx, rng, dur, leases, armed)
		if res.frozen {
			return res
		}
		whys = append(whys, why)
		time.Sleep(100 * time.Millisecond) // the supervisor reaps and restarts the dead
	}
	fmt.Fprintf(os.Stderr, "(freeze skipped: %s) ", strings.Join(whys, "; "))
	return freezeResult{}
}

// freezeAttempts bounds how many consumers a freeze arms in turn.
const freezeAttempts = 10

// tryFreeze is one attempt of freezeOne on one consumer.
// why says what kept it from freezing one.
func (s *supervisor) tryFreeze(ctx context.Context, rng *rand.Rand, dur time.Duration, leases bool, armed func()) (res freezeResult, why string) {
	cmd, stats := s.pickFrozen(ctx, rng)
	if cmd == nil {
		return res, "no running consumer"
	}
	before := statCounter(stats, idemq.CountLeasesLost)
	if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		return res, fmt.Sprintf("SIGUSR1: %v", err)
	}
	armed()
	pid := cmd.Process.Pid
	armedAt := time.Now()
	for time.Since(armedAt) < freezeArmWait {
		st := procState(pid)
		if st == 'T' {
			res.midHandler = true
			break
		}
		if st == 'Z' || st == 'X' || (st == 0 && cmd.Process.Signal(syscall.Signal(0)) != nil) {
			return res, "the armed consumer died before it stopped" // a kill or a crash point
		}
		time.Sleep(2 * time.Millisecond)
	}
	if !res.midHandler {
		// No delivery reached a handler (an idle consumer): freeze it
		// where it is.
		if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			return res, fmt.Sprintf("SIGSTOP: %v", err)
		}
	}
	res.frozen = true
	select {
	case <-time.After(dur):
	case <-ctx.Done():
	}
	if cmd.Process.Signal(syscall.SIGCONT) != nil {
		return res, "" // killed while frozen
	}
	if !leases {
		return res, ""
	}
	thawed := time.Now()
	for time.Since(thawed) < 3*time.Second {
		if n := statCounter(stats, idemq.CountLeasesLost) - before; n > 0 {
			// Let the other workers frozen with it report theirs too.
			time.Sleep(100 * time.Millisecond)
			res.leasesLost = statCounter(stats, idemq.CountLeasesLost) - before
			return res, ""
		}
		time.Sleep(20 * time.Millisecond)
	}
	return res, ""
}

// pickFrozen returns a random running consumer that has written its stats
// file (so its freeze hook is installed), waiting up to 10 s for one.
func (s *supervisor) pickFrozen(ctx context.Context, rng *rand.Rand) (*exec.Cmd, string) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		s.mu.Lock()
		var slots []int
		for slot, cmd := range s.procs {
			// Dead and not reaped yet ('Z'): not a candidate.
			if st := procState(cmd.Process.Pid); st == 'Z' || st == 'X' {
				continue
			}
			if _, err := os.Stat(s.statsOf[slot]); err == nil {
				slots = append(slots, slot)
			}
		}
		if len(slots) > 0 {
			sort.Ints(slots)
			slot := slots[rng.IntN(len(slots))]
			cmd, stats := s.procs[slot], s.statsOf[slot]
			s.mu.Unlock()
			return cmd, stats
		}
		s.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	return nil, ""
}

// statCounter reads one counter from a consumer's stats file (0 if it
// cannot).
func statCounter(path, name string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	m := map[string]int64{}
	if json.Unmarshal(b, &m) != nil {
		return 0
	}
	return m[name]
}

// procState is the state letter of a process in /proc/<pid>/stat ('R',
// 'S', 'T' stopped, 'Z'…), or 0 when it cannot be read (gone, or no
// /proc: then a freeze never sees the consumer stop itself and stops it
// after freezeArmWait).
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// "pid (comm) S ...": comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}
