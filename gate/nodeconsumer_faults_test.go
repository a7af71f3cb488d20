//go:build faults

package gate_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/testenv"
)

// nodeConsumerSrc holds the Node consumer: consumer.js, with amqplib
// pinned by package.json and package-lock.json.
const nodeConsumerSrc = "testdata/node-consumer"

// unavailable fails the test with CI=true and skips it elsewhere.
func unavailable(t *testing.T, msg string) {
	t.Helper()
	if testenv.InCI() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// installNodeConsumer copies the Node consumer into a fresh folder, runs
// `npm ci` there (amqplib as locked, from npm's cache when it has it) and
// returns the node binary and the script. With CI=true a missing node or
// npm, or a failed install, fails the test; elsewhere it skips.
func installNodeConsumer(t *testing.T) (node, script string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		unavailable(t, "no node on PATH (scripts/services.sh up installs Debian's nodejs and npm)")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		unavailable(t, "no npm on PATH (scripts/services.sh up installs Debian's nodejs and npm)")
	}
	dir := t.TempDir()
	for _, f := range []string{"package.json", "package-lock.json", "consumer.js"} {
		b, err := os.ReadFile(filepath.Join(nodeConsumerSrc, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--prefer-offline")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		unavailable(t, "npm ci in "+nodeConsumerSrc+": "+err.Error()+"\n"+string(out))
	}
	return node, filepath.Join(dir, "consumer.js")
}

// lockedBuffer is a bytes.Buffer safe for a writer and readers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// nodeReader is an outputReader: the Node consumer (amqplib, manual acks)
// reads the output queue and prints each message ID; the test counts the
// lines. Its connection goes straight to the broker, not through the
// proxy the faults cut: the faults are the gates', and a cut reader would
// add the broker's own redeliveries of unacked copies.
func nodeReader(t *testing.T, queue string) (*outCounter, func()) {
	t.Helper()
	node, script := installNodeConsumer(t)
	cmd := exec.Command(node, script)
	cmd.Env = testenv.Env("AMQP_URL="+testenv.AMQPURL(), "QUEUE="+queue, "PREFETCH=100", "IDLE_MS=300000")
	// The consumer stops when its stdin closes: it does not outlive a
	// test binary that dies.
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderrPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out := newOutCounter()
	var stderr lockedBuffer
	var (
		mu    sync.Mutex
		ready bool
	)
	var readers sync.WaitGroup
	readers.Add(2)
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			out.add(sc.Text())
		}
	}()
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stderrPipe)
		for sc.Scan() {
			line := sc.Text()
			_, _ = stderr.Write([]byte(line + "\n"))
			if line == "ready" {
				mu.Lock()
				ready = true
				mu.Unlock()
			}
		}
	}()
	exited := make(chan struct{})
	var waitErr error
	go func() {
		readers.Wait() // every line read before Wait closes the pipes
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Node consumer: %d copies read; stderr:\n%s", out.arrived(), stderr.String())
		}
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		<-exited
	})
	testenv.Eventually(t, 60*time.Second, "the Node consumer ready", func() bool {
		select {
		case <-exited:
			t.Fatalf("the Node consumer exited: %v\n%s", waitErr, stderr.String())
		default:
		}
		mu.Lock()
		defer mu.Unlock()
		return ready
	})
	finish := func() {
		t.Helper()
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			t.Fatal(err)
		}
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			t.Fatalf("the Node consumer did not stop on SIGTERM:\n%s", stderr.String())
		}
		if waitErr != nil || !strings.Contains(stderr.String(), "stopping (SIGTERM)") {
			t.Fatalf("the Node consumer: %v\n%s", waitErr, stderr.String())
		}
		// Its channel closed cleanly: every copy it was given is acked,
		// so printed (it prints before it acks); none went back.
		if m, _ := testenv.QueueCounts(t, queue); m != 0 {
			t.Fatalf("%d copies back in the output queue after the Node consumer stopped", m)
		}
	}
	return out, finish
}

// The proof, with a downstream consumer that is not Go: Node's
// amqplib reads the gate's output queue (manual acks) while producers
// resend 30% of the messages under the same ID, gates are SIGKILLed and
// restarted, and the gates' connections are cut. Every unique message
// reaches the Node consumer at least once; duplicates stay within the
// crash window's bound (the forwards in flight per fault: Workers per
// kill, both gates' Workers per cut), and those that arrived before the
// first fault are counted apart.
func TestFaultGateNodeConsumer(t *testing.T) {
	const n, kills, cuts = 5000, 6, 3
	res := gateChaos(t, n, kills, cuts, nodeReader)
	t.Logf("Node consumer (amqplib): %d unique of %d, %d copies received, %d duplicates (bound %d, %d before the first fault); of %d copies published (%d resends) the gates held back %d",
		res.unique, n, res.received, res.twice, kills*faultWorkers+cuts*2*faultWorkers, res.beforeFault, res.published, res.resent, res.published-res.received)
	if res.unique != n {
		t.Fatalf("the Node consumer received %d of %d unique messages", res.unique, n)
	}
	if bound := kills*faultWorkers + cuts*2*faultWorkers; res.twice > bound {
		t.Fatalf("%d duplicates at the Node consumer in %d kills and %d cuts: more than the %d forwards in flight", res.twice, kills, cuts, bound)
	}
}
