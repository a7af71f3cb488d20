package console

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// job is a long operation on one dead-letter queue, run in the background;
// its page shows progress.
type job struct {
	ID    string
	Queue queuePair
	What  string
	Total int
	Done  atomic.Int64

	mu       sync.Mutex
	state    string // running, done, failed
	summary  string
	err      string
	started  time.Time
	finished time.Time
}

// jobView is a job as its page shows it.
type jobView struct {
	ID, What, State, Summary, Err string
	Done, Total                   int64
	Elapsed                       string
	Running                       bool
}

func (j *job) view() jobView {
	j.mu.Lock()
	defer j.mu.Unlock()
	end := j.finished
	if end.IsZero() {
		end = time.Now()
	}
	return jobView{ID: j.ID, What: j.What, State: j.state, Summary: j.summary, Err: j.err,
		Done: j.Done.Load(), Total: int64(j.Total), Elapsed: end.Sub(j.started).Round(time.Millisecond).String(),
		Running: j.state == "running"}
}

type jobs struct {
	mu    sync.Mutex
	byID  map[string]*job
	order []string
}

func newJobs() *jobs { return &jobs{byID: map[string]*job{}} }

// maxJobs bounds the jobs remembered.
const maxJobs = 100

func (js *jobs) add(j *job) {
	js.mu.Lock()
	defer js.mu.Unlock()
	js.byID[j.ID] = j
	js.order = append(js.order, j.ID)
	for len(js.order) > maxJobs {
		old := js.byID[js.order[0]]
		if old != nil && old.view().Running {
			break
		}
		delete(js.byID, js.order[0])
		js.order = js.order[1:]
	}
}

func (js *jobs) get(id string) *job {
	js.mu.Lock()
	defer js.mu.Unlock()
	return js.byID[id]
}

// start runs fn as a job on p's dead-letter queue, holding the queue's
// lock; refused while another job runs on it.
func (s *Server) start(p queuePair, what string, total int, fn func(context.Context, *job) (string, error)) (*job, error) {
	s.mu.Lock()
	if id := s.busy[p.DLQ]; id != "" {
		s.mu.Unlock()
		return nil, fmt.Errorf("job %s is running on %s: wait for it", id, p.DLQ)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	j := &job{ID: hex.EncodeToString(b[:]), Queue: p, What: what, Total: total, state: "running", started: time.Now()}
	s.busy[p.DLQ] = j.ID
	s.mu.Unlock()
	s.jobs.add(j)
	go func() {
		l := s.qlock(p.DLQ)
		l.Lock()
		summary, err := fn(s.ctx, j)
		l.Unlock()
		j.mu.Lock()
		j.summary, j.finished, j.state = summary, time.Now(), "done"
		if err != nil {
			j.err, j.state = err.Error(), "failed"
		}
		j.mu.Unlock()
		s.mu.Lock()
		delete(s.busy, p.DLQ)
		s.mu.Unlock()
		s.log.Info("console job finished", "job", j.ID, "what", what, "state", j.state, "summary", s.clean(summary), "err", s.errText(err))
	}()
	return j, nil
}
