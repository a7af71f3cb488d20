// The consumer process supervisor: it keeps N `bank consume` children
// running, restarting those that die, kills one on demand, stops them all
// (SIGTERM, then SIGQUIT and SIGKILL for a hung one) and reads their stats.
// freeze.go adds the freezes.

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// supervisor keeps N `bank consume` child processes running, restarting the
// ones that die (SIGKILL from the demo or from a crash hook).
type supervisor struct {
	o                      demoOpts
	mode, queue, db, dir   string
	mu                     sync.Mutex
	procs                  map[int]*exec.Cmd
	statsOf                map[int]string // slot → its running child's stats file
	statFiles              []string
	stopping               atomic.Bool
	wg                     sync.WaitGroup
	crashN, restartN, seqN atomic.Int64
	stuckN                 atomic.Int64
	exitedN                atomic.Int64 // children that exited by themselves
	name                   string       // names its children's log and stats files
}

func newSupervisor(name string, o demoOpts, mode, queue, db, dir string) *supervisor {
	return &supervisor{name: name, o: o, mode: mode, queue: queue, db: db, dir: dir, procs: map[int]*exec.Cmd{}, statsOf: map[int]string{}}
}

func (s *supervisor) start(n int) {
	for slot := 0; slot < n; slot++ {
		s.wg.Add(1)
		go s.run(slot)
	}
}

func (s *supervisor) run(slot int) {
	defer s.wg.Done()
	self, _ := os.Executable()
	for first := true; !s.stopping.Load(); first = false {
		if !first {
			s.restartN.Add(1)
		}
		seq := s.seqN.Add(1)
		stats := filepath.Join(s.dir, fmt.Sprintf("stats-%s-%d.json", s.name, seq))
		cmd := s.command(self, stats)
		logf, _ := os.Create(filepath.Join(s.dir, fmt.Sprintf("consumer-%s-%d.log", s.name, seq)))
		cmd.Stdout, cmd.Stderr = logf, logf
		setPdeathsig(cmd)
		// Start and register under mu, checking stopping there too: stopAll
		// sets stopping under mu, so a child is either started before it
		// (and gets its SIGTERM) or not at all. Without this a child started
		// just as stopAll ran got no signal and stopAll waited for ever.
		s.mu.Lock()
		if s.stopping.Load() {
			s.mu.Unlock()
			logf.Close()
			return
		}
		if err := cmd.Start(); err != nil {
			s.mu.Unlock()
			fmt.Fprintln(os.Stderr, "start consumer:", err)
			logf.Close()
			time.Sleep(time.Second)
			continue
		}
		s.procs[slot] = cmd
		s.statsOf[slot] = stats
		s.statFiles = append(s.statFiles, stats)
		s.mu.Unlock()
		err := cmd.Wait()
		logf.Close()
		s.mu.Lock()
		delete(s.procs, slot)
		delete(s.statsOf, slot)
		s.mu.Unlock()
		var ee *exec.ExitError
		if err == nil && !s.stopping.Load() {
			s.exitedN.Add(1) // exited 0 by itself
			fmt.Fprintf(os.Stderr, "consumer exited by itself with status 0\n")
		}
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
				s.crashN.Add(1)
			} else if !s.stopping.Load() {
				s.exitedN.Add(1)
				b, _ := os.ReadFile(logf.Name())
				fmt.Fprintf(os.Stderr, "consumer exited: %v\n%s\n", err, tail(string(b), 800))
				time.Sleep(500 * time.Millisecond)
			}
		}
	}
}

// command is a `bank consume` child of the supervisor's mode, writing its
// counters to stats; crash points and freezes armed as the options say.
func (s *supervisor) command(self, stats string) *exec.Cmd {
	cmd := exec.Command(self, "consume", "--mode", consumerMode(s.mode), "--queue", s.queue, "--queue-type", s.o.queueType,
		"--amqp", s.o.amqpURL, "--postgres", s.db, "--redis", s.o.redisURL, "--stats", stats,
		"--lease", consumerLease.String(), "--workers", "4", "--prefetch", "50")
	if s.o.failRate > 0 {
		cmd.Args = append(cmd.Args, "--fail-rate", fmt.Sprint(s.o.failRate))
	}
	if s.o.amqpURLs != "" {
		cmd.Args = append(cmd.Args, "--amqp-urls", s.o.amqpURLs)
	}
	if s.o.sentinels != "" {
		cmd.Args = append(cmd.Args, "--redis-sentinels", s.o.sentinels, "--redis-master", s.o.master)
	}
	if s.o.redisCluster != "" {
		cmd.Args = append(cmd.Args, "--redis-cluster", s.o.redisCluster)
	}
	cmd.Env = os.Environ()
	if s.o.crashRate > 0 {
		cmd.Env = append(cmd.Env, "IDEMQ_BANK_CRASH=before-claim,in-handler,after-commit,before-ack",
			fmt.Sprintf("IDEMQ_BANK_CRASH_RATE=%g", s.o.crashRate))
	}
	if s.o.freezes > 0 {
		cmd.Env = append(cmd.Env, "IDEMQ_BANK_FREEZE=1") // SIGUSR1 arms a freeze
	}
	return cmd
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (s *supervisor) killOne(rng *rand.Rand) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	var slots []int
	for k := range s.procs {
		slots = append(slots, k)
	}
	if len(slots) == 0 {
		return false
	}
	sort.Ints(slots)
	cmd := s.procs[slots[rng.IntN(len(slots))]]
	return cmd.Process.Signal(syscall.SIGKILL) == nil
}

// stopGrace is how long a consumer has to exit after SIGTERM (its own
// ShutdownTimeout is 10 s) before stopAll takes it for hung.
const stopGrace = 60 * time.Second

// stopAll sends SIGTERM to every child and waits for them to exit. A child
// still running after stopGrace breaks the contract (SIGTERM: finish and
// exit 0): it gets SIGQUIT, so its goroutines are dumped into its log, then
// SIGKILL, and is counted in stuck.
func (s *supervisor) stopAll() {
	s.mu.Lock()
	s.stopping.Store(true)
	for _, cmd := range s.procs {
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(stopGrace):
	}
	s.mu.Lock()
	for slot, cmd := range s.procs {
		s.stuckN.Add(1)
		fmt.Fprintf(os.Stderr, "consumer %s/%d (pid %d) still running %v after SIGTERM: SIGQUIT, then SIGKILL\n",
			s.name, slot, cmd.Process.Pid, stopGrace)
		_ = cmd.Process.Signal(syscall.SIGQUIT)
	}
	s.mu.Unlock()
	select {
	case <-done:
		return
	case <-time.After(5 * time.Second):
	}
	s.mu.Lock()
	for _, cmd := range s.procs {
		_ = cmd.Process.Kill()
	}
	s.mu.Unlock()
	<-done
}

// stuck counts children that did not exit within stopGrace of SIGTERM.
func (s *supervisor) stuck() int { return int(s.stuckN.Load()) }

// crashes counts children that died of SIGKILL, whoever sent it; the
// demo's own kills are a subset.
func (s *supervisor) crashes() int  { return int(s.crashN.Load()) }
func (s *supervisor) exited() int   { return int(s.exitedN.Load()) }
func (s *supervisor) restarts() int { return int(s.restartN.Load()) }

func (s *supervisor) stats() []map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]int64
	for _, f := range s.statFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		m := map[string]int64{}
		if json.Unmarshal(b, &m) == nil {
			out = append(out, m)
		}
	}
	return out
}
