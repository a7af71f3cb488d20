package console

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/redact"
)

// depth is one sample of a queue pair.
type depth struct {
	Work, DLQ, Consumers int
}

type sample struct {
	At     time.Time
	Depths []depth // by pair, -1 when the queue could not be read
}

// sampler reads the depth of every queue pair periodically (AMQP passive
// declares: no management plugin needed) and keeps a window of history.
type sampler struct {
	url      string
	pairs    []queuePair
	interval time.Duration
	keep     int
	log      *slog.Logger

	mu      sync.Mutex // the connection
	conn    *amqp.Connection
	hist    []sample
	stopped bool
}

func newSampler(url string, pairs []queuePair, interval, window time.Duration, log *slog.Logger) *sampler {
	return &sampler{url: url, pairs: pairs, interval: interval, keep: max(2, int(window/interval)), log: log}
}

// count is the ready messages and consumers of queue (-1 when missing).
func (sm *sampler) count(queue string) (int, int, error) {
	if sm.conn == nil || sm.conn.IsClosed() {
		c, err := amqp.Dial(sm.url)
		if err != nil {
			return -1, 0, fmt.Errorf("connect to %s: %w", redact.URL(sm.url), err)
		}
		sm.conn = c
	}
	ch, err := sm.conn.Channel()
	if err != nil {
		return -1, 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return -1, 0, fmt.Errorf("queue %q: %w", queue, err)
	}
	return q.Messages, q.Consumers, nil
}

// depths samples pair p now.
func (sm *sampler) depths(_ context.Context, p queuePair) (depth, error) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	var d depth
	var err error
	if d.DLQ, _, err = sm.count(p.DLQ); err != nil {
		return d, err
	}
	d.Work, d.Consumers, err = sm.count(p.Work)
	return d, err
}

func (sm *sampler) run(ctx context.Context) {
	t := time.NewTicker(sm.interval)
	defer t.Stop()
	for {
		sm.once(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (sm *sampler) once(ctx context.Context) {
	smp := sample{At: time.Now(), Depths: make([]depth, len(sm.pairs))}
	for i, p := range sm.pairs {
		d, err := sm.depths(ctx, p)
		if err != nil {
			d = depth{Work: -1, DLQ: -1}
			sm.log.Debug("console sample", "queue", p.Work, "err", err)
		}
		smp.Depths[i] = d
	}
	sm.mu.Lock()
	defer sm.mu.Unlock()
	sm.hist = append(sm.hist, smp)
	if len(sm.hist) > sm.keep {
		sm.hist = append([]sample(nil), sm.hist[len(sm.hist)-sm.keep:]...)
	}
}

func (sm *sampler) stop() {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	if sm.conn != nil {
		sm.conn.Close()
	}
	sm.stopped = true
}

// series is one queue pair's history as the chart draws it.
type series struct {
	Work, DLQ string
	// WorkPoints and DLQPoints are SVG polyline points.
	WorkPoints, DLQPoints string
	Max                   int
	LastWork, LastDLQ     int
	Consumers             int
	// WorkRate is the work queue's net change (msg/s, + growing) over the
	// last minute; DeadPerMin the dead letters added in the last minute.
	WorkRate   string
	DeadPerMin int
	Samples    int
}

// Chart geometry.
const (
	chartW = 600
	chartH = 120
)

// chart is the history per pair, scaled for an SVG of chartW×chartH.
func (sm *sampler) chart() []series {
	sm.mu.Lock()
	hist := append([]sample(nil), sm.hist...)
	sm.mu.Unlock()
	out := make([]series, len(sm.pairs))
	for i, p := range sm.pairs {
		se := series{Work: p.Work, DLQ: p.DLQ, Samples: len(hist), Max: 1, WorkRate: "0.0"}
		for _, h := range hist {
			se.Max = max(se.Max, h.Depths[i].Work, h.Depths[i].DLQ)
		}
		var wp, dp []string
		n := len(hist)
		for k, h := range hist {
			x := 0
			if n > 1 {
				x = k * chartW / (n - 1)
			}
			d := h.Depths[i]
			if d.Work >= 0 {
				wp = append(wp, fmt.Sprintf("%d,%d", x, chartH-d.Work*chartH/se.Max))
			}
			if d.DLQ >= 0 {
				dp = append(dp, fmt.Sprintf("%d,%d", x, chartH-d.DLQ*chartH/se.Max))
			}
		}
		se.WorkPoints, se.DLQPoints = strings.Join(wp, " "), strings.Join(dp, " ")
		if n > 0 {
			last := hist[n-1]
			se.LastWork, se.LastDLQ, se.Consumers = last.Depths[i].Work, last.Depths[i].DLQ, last.Depths[i].Consumers
			// The last minute.
			first := n - 1
			for first > 0 && last.At.Sub(hist[first-1].At) <= time.Minute {
				first--
			}
			for k := first + 1; k < n; k++ {
				if a, b := hist[k-1].Depths[i].DLQ, hist[k].Depths[i].DLQ; a >= 0 && b > a {
					se.DeadPerMin += b - a
				}
			}
			if dt := last.At.Sub(hist[first].At).Seconds(); dt > 0 && last.Depths[i].Work >= 0 && hist[first].Depths[i].Work >= 0 {
				se.WorkRate = fmt.Sprintf("%+.1f", float64(last.Depths[i].Work-hist[first].Depths[i].Work)/dt)
			}
		}
		out[i] = se
	}
	return out
}

func (s *Server) livePage(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, "live", "Live", map[string]any{"Chart": s.sampler.chart(), "Interval": s.cfg.SampleInterval.String()}, "")
}

func (s *Server) liveJSON(w http.ResponseWriter, r *http.Request) {
	s.sampler.mu.Lock()
	hist := append([]sample(nil), s.sampler.hist...)
	s.sampler.mu.Unlock()
	type point struct {
		At                   time.Time `json:"at"`
		Work, DLQ, Consumers int
	}
	out := map[string][]point{}
	for i, p := range s.pairs {
		pts := make([]point, 0, len(hist))
		for _, h := range hist {
			d := h.Depths[i]
			pts = append(pts, point{At: h.At, Work: d.Work, DLQ: d.DLQ, Consumers: d.Consumers})
		}
		out[p.Work] = pts
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
