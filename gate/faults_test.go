//go:build faults

package gate_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/gate"
	"github.com/idemq/idemq/internal/redistest"
	"github.com/idemq/idemq/internal/testenv"
)

// Environment of the helper gate process.
const (
	envGateHelper   = "IDEMQ_GATE_HELPER"
	envGateURL      = "IDEMQ_GATE_URL"
	envGateIngress  = "IDEMQ_GATE_INGRESS"
	envGateExchange = "IDEMQ_GATE_EXCHANGE"
	envGatePrefix   = "IDEMQ_GATE_PREFIX"
)

const (
	faultLease   = 2 * time.Second
	faultWorkers = 16
)

// TestHelperGateProcess is not a test: it is the gate process the fault
// tests start (the test binary re-executed), kill with SIGKILL and restart.
func TestHelperGateProcess(t *testing.T) {
	if os.Getenv(envGateHelper) != "1" {
		return
	}
	opt, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	g, err := gate.New(gate.Config{
		URL:     os.Getenv(envGateURL),
		Ingress: os.Getenv(envGateIngress),
		Routes:  []gate.Route{{Exchange: os.Getenv(envGateExchange), RoutingKey: "out"}},
		Store:   redistest.Store(t, rdb, redisstore.Config{KeyPrefix: os.Getenv(envGatePrefix) + ":"}),
		Lease:   faultLease,
		Workers: faultWorkers,
		Logger:  quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := g.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

type gateProc struct {
	cmd *exec.Cmd
	out bytes.Buffer
}

func startGateProc(t *testing.T, r *rig, url string) *gateProc {
	t.Helper()
	p := &gateProc{}
	p.cmd = exec.Command(os.Args[0], "-test.run=^TestHelperGateProcess$", "-test.count=1")
	p.cmd.Env = testenv.Env(envGateHelper+"=1", envGateURL+"="+url, envGateIngress+"="+r.ingress,
		envGateExchange+"="+r.exchange, envGatePrefix+"="+r.prefix)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *gateProc) kill() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

// outCounter counts each message ID read from the output queue, in the
// order of arrival.
type outCounter struct {
	mu      sync.Mutex
	seen    map[string]int
	copies  int   // lines (deliveries) so far
	extraAt []int // arrival number of every copy after an ID's first
}

func newOutCounter() *outCounter { return &outCounter{seen: map[string]int{}} }

func (c *outCounter) add(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.copies++
	c.seen[id]++
	if c.seen[id] > 1 {
		c.extraAt = append(c.extraAt, c.copies)
	}
}

func (c *outCounter) unique() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

func (c *outCounter) arrived() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.copies
}

// outputReader starts the downstream reader of queue; finish (called once
// the queue is drained) stops it and returns when every copy it read has
// been counted.
type outputReader func(t *testing.T, queue string) (out *outCounter, finish func())

// goReader consumes the output queue with amqp091-go (auto-ack).
func goReader(t *testing.T, queue string) (*outCounter, func()) {
	t.Helper()
	ch := testenv.Channel(t)
	ds, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newOutCounter()
	go func() {
		for d := range ds {
			c.add(d.MessageId)
		}
	}()
	return c, func() {}
}

// chaosResult is what the downstream reader saw in a gateChaos run.
type chaosResult struct {
	published, resent int // copies published to the ingress queue, and how many were resends
	unique            int // message IDs received
	received          int // copies received
	twice             int // copies received after an ID's first (received - unique)
	beforeFault       int // of twice, copies that arrived before the first fault struck
}

// gateChaos runs two gate processes on one ingress queue while the
// producer resends 30% of n messages under the same ID, SIGKILLs a random
// gate (and restarts it) kills times and cuts every gate connection cuts
// times, at evenly spread points of the progress; read consumes the
// output queue. It fails if a message is left in the ingress queue or
// dead-lettered, and returns the counts, among them the duplicates that
// arrived before the first fault (only a fault, or a lease lost by a gate
// stalled under load, opens the crash window).
func gateChaos(t *testing.T, n, kills, cuts int, read outputReader) chaosResult {
	r := newRig(t)
	proxy, url := testenv.AMQPProxy(t)
	out, finish := read(t, r.out)

	var pubs []amqp.Publishing
	resent := 0
	for i := 0; i < n; i++ {
		p := amqp.Publishing{MessageId: "m-" + strconv.Itoa(i), Body: []byte(strconv.Itoa(i)), DeliveryMode: amqp.Persistent}
		pubs = append(pubs, p)
		if rand.IntN(10) < 3 {
			pubs = append(pubs, p) // a producer resend after a lost confirm
			resent++
		}
	}
	rand.Shuffle(len(pubs), func(i, j int) { pubs[i], pubs[j] = pubs[j], pubs[i] })
	testenv.Publish(t, "", r.ingress, pubs...)

	procs := []*gateProc{startGateProc(t, r, url), startGateProc(t, r, url)}
	t.Cleanup(func() {
		for i, p := range procs {
			p.kill()
			if t.Failed() {
				t.Logf("gate %d output:\n%s", i, p.out.String())
			}
		}
	})
	faults := kills + cuts
	kinds := make([]bool, faults) // true: kill
	for i := 0; i < kills; i++ {
		kinds[i] = true
	}
	rand.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	firstFault := -1 // copies received when the first fault struck
	for i, kill := range kinds {
		at := (i + 1) * n / (faults + 2)
		at += rand.IntN(n/(faults+2)/2 + 1) // a random point, under load
		testenv.Eventually(t, 60*time.Second, fmt.Sprintf("%d forwarded before fault %d", at, i+1), func() bool {
			return out.unique() >= at
		})
		if firstFault < 0 {
			firstFault = out.arrived()
		}
		t.Logf("fault %d (kill=%v) at %d unique, %d copies received", i+1, kill, out.unique(), out.arrived())
		if kill {
			k := rand.IntN(len(procs))
			procs[k].kill()
			procs[k] = startGateProc(t, r, url)
		} else {
			proxy.Cut()
		}
	}
	testenv.Eventually(t, 90*time.Second, "every unique message forwarded", func() bool { return out.unique() == n })
	// Everything settled: the ingress queue is empty and stays so while
	// the gates' deferred copies (held for a lease) come back and go.
	ch := testenv.Channel(t)
	empty := func() bool {
		q, err := ch.QueueDeclarePassive(r.ingress, true, false, false, false, nil)
		return err == nil && q.Messages == 0
	}
	var since time.Time
	testenv.Eventually(t, 60*time.Second, "ingress settled", func() bool {
		if !empty() {
			since = time.Time{}
			return false
		}
		if since.IsZero() {
			since = time.Now()
		}
		return time.Since(since) > 2*faultLease
	})
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		done := make(chan struct{})
		go func() { _ = p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Fatalf("gate did not stop on SIGTERM:\n%s", p.out.String())
		}
	}
	if m, _ := testenv.QueueCounts(t, r.ingress); m != 0 {
		t.Fatalf("%d messages left in the ingress queue", m)
	}
	if m, _ := testenv.QueueCounts(t, r.dlq); m != 0 {
		t.Fatalf("%d messages dead-lettered", m)
	}
	testenv.Eventually(t, 30*time.Second, "output drained", func() bool {
		q, err := ch.QueueDeclarePassive(r.out, true, false, false, false, nil)
		return err == nil && q.Messages == 0
	})
	finish()
	out.mu.Lock()
	defer out.mu.Unlock()
	res := chaosResult{published: len(pubs), resent: resent, unique: len(out.seen), received: out.copies}
	for _, c := range out.seen {
		if c > 1 {
			res.twice += c - 1
		}
	}
	for _, at := range out.extraAt {
		// The output queue is FIFO and has one reader: a copy forwarded
		// again after a fault arrives after every copy that had arrived
		// when the fault struck. A duplicate before that is no fault's;
		// seen once in 13 runs (Lease 2 s, load average 15–18), cause not
		// yet traced, most likely a lease lost by a gate stalled past
		// 0.8×Lease (it gives its forward back). Counted and printed,
		// and within the bound.
		if firstFault >= 0 && at <= firstFault {
			res.beforeFault++
		}
	}
	t.Logf("published %d (%d unique, %d producer resends); %d SIGKILLs, %d connection cuts; received %d copies of %d unique IDs, lost %d, received again %d (%.2f per fault, %.3f%% of unique; %d before the first fault)",
		res.published, n, resent, kills, cuts, res.received, res.unique, n-res.unique, res.twice,
		float64(res.twice)/float64(max(kills+cuts, 1)), 100*float64(res.twice)/float64(n), res.beforeFault)
	return res
}

// Gates killed with SIGKILL at random points under load lose nothing; the
// only duplicates are the crash window — killed after a publish left for
// the broker and before its ID was completed — at most one per message
// the killed gate was forwarding (Workers).
func TestFaultGateKill(t *testing.T) {
	const n, kills = 6000, 10
	res := gateChaos(t, n, kills, 0, goReader)
	if res.unique != n {
		t.Fatalf("forwarded %d of %d", res.unique, n)
	}
	if res.twice > kills*faultWorkers {
		t.Fatalf("%d messages forwarded again in %d kills: more than the %d forwards in flight per kill", res.twice, kills, faultWorkers)
	}
}

// Connections cut under load (both gates' consumer and forwarder
// connections) lose nothing; a forward whose confirm was lost with its
// connection is published again (the publisher's own ambiguity).
func TestFaultGateConnectionCuts(t *testing.T) {
	const n, cuts = 3000, 4
	res := gateChaos(t, n, 0, cuts, goReader)
	if res.unique != n {
		t.Fatalf("forwarded %d of %d", res.unique, n)
	}
	if res.twice > cuts*2*faultWorkers {
		t.Fatalf("%d messages forwarded again in %d cuts", res.twice, cuts)
	}
}
