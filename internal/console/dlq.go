package console

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"sync"

	"github.com/idemq/idemq/deadletter"
	"github.com/idemq/idemq/internal/display"
)

// qlock is the lock of one dead-letter queue: a list or an operation at a
// time (two readers would split the messages between them).
func (s *Server) qlock(dlq string) *sync.Mutex {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.qlocks[dlq]
	if !ok {
		l = &sync.Mutex{}
		s.qlocks[dlq] = l
	}
	return l
}

func (s *Server) busyJob(dlq string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.busy[dlq]
}

// pair returns the configured queue pair of the request's q parameter.
func (s *Server) pair(w http.ResponseWriter, r *http.Request) (queuePair, bool) {
	q := r.FormValue("q")
	p, ok := s.byDLQ[q]
	if !ok {
		if p2, ok2 := s.byDLQ[pairOf(q).DLQ]; ok2 {
			return p2, true
		}
		s.refuse(w, r, http.StatusNotFound, fmt.Sprintf("queue %q is not one of this console's queues", q))
		return queuePair{}, false
	}
	return p, true
}

// listing is one read of a dead-letter queue.
type listing struct {
	Total   int
	Entries []*deadletter.Entry
	Groups  []deadletter.Group
	Dups    int
}

// list reads dlq (at most ScanLimit dead letters) under its lock.
func (s *Server) list(ctx context.Context, dlq string, opts deadletter.ListOptions) (listing, error) {
	l := s.qlock(dlq)
	l.Lock()
	defer l.Unlock()
	c, err := deadletter.Open(s.cfg.AMQPURL)
	if err != nil {
		return listing{}, err
	}
	defer c.Close()
	if opts.Limit == 0 {
		opts.Limit = s.cfg.ScanLimit
	}
	total, entries, err := c.List(ctx, dlq, opts)
	if err != nil {
		return listing{}, err
	}
	out := listing{Total: total, Entries: entries, Groups: deadletter.GroupEntries(entries)}
	for _, e := range entries {
		out.Dups += e.Duplicates
	}
	return out, nil
}

type queueRow struct {
	queuePair
	DLQDepth, WorkDepth, Consumers int
	Err                            string
	Job                            string
}

func (s *Server) overview(w http.ResponseWriter, r *http.Request) {
	rows := make([]queueRow, 0, len(s.pairs))
	for _, p := range s.pairs {
		row := queueRow{queuePair: p, Job: s.busyJob(p.DLQ)}
		smp, err := s.sampler.depths(r.Context(), p)
		if err != nil {
			row.Err = s.errText(err)
		} else {
			row.DLQDepth, row.WorkDepth, row.Consumers = smp.DLQ, smp.Work, smp.Consumers
		}
		rows = append(rows, row)
	}
	s.render(w, r, "overview", "Dead-letter queues", map[string]any{"Queues": rows, "Chart": s.sampler.chart()}, "")
}

func (s *Server) dlqPage(w http.ResponseWriter, r *http.Request) {
	p, ok := s.pair(w, r)
	if !ok {
		return
	}
	data := map[string]any{"Q": p, "Job": s.busyJob(p.DLQ), "ScanLimit": s.cfg.ScanLimit}
	if data["Job"] != "" {
		s.render(w, r, "dlq", p.DLQ, data, "")
		return
	}
	ls, err := s.list(r.Context(), p.DLQ, deadletter.ListOptions{})
	if err != nil {
		s.render(w, r, "dlq", p.DLQ, data, s.errText(err))
		return
	}
	data["L"] = ls
	data["Shown"] = min(len(ls.Entries), 200)
	data["Entries"] = ls.Entries[:min(len(ls.Entries), 200)]
	data["Truncated"] = len(ls.Entries) >= s.cfg.ScanLimit
	s.render(w, r, "dlq", p.DLQ, data, "")
}

// headerRow is one header as the detail page shows it.
type headerRow struct{ Key, Value string }

func showHeader(v any) string { return deadletter.FormatHeader(v, false) }

// bodyView is a body as JSON pretty-printed when it is JSON, else a hex
// dump.
func bodyView(e *deadletter.Entry) (kind, text string) {
	raw := []byte(e.Body)
	if e.BodyEncoding == "base64" {
		b, err := base64.StdEncoding.DecodeString(e.Body)
		if err != nil {
			return "base64", e.Body
		}
		raw = b
	}
	if json.Valid(raw) && len(bytes.TrimSpace(raw)) > 0 {
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "  "); err == nil {
			return "JSON", buf.String()
		}
	}
	const maxDump = 64 << 10
	cut := ""
	if len(raw) > maxDump {
		raw, cut = raw[:maxDump], fmt.Sprintf("\n… %d more bytes", len(raw)-maxDump)
	}
	return "hex", hex.Dump(raw) + cut
}

func (s *Server) messagePage(w http.ResponseWriter, r *http.Request) {
	p, ok := s.pair(w, r)
	if !ok {
		return
	}
	id := r.FormValue("id")
	pos, _ := strconv.Atoi(r.FormValue("pos"))
	if id == "" && pos <= 0 {
		s.refuse(w, r, http.StatusBadRequest, "name a message: id or pos")
		return
	}
	flt := deadletter.WithMessageID(id)
	if id == "" {
		flt = func(e *deadletter.Entry) bool { return e.Position == pos }
	}
	data := map[string]any{"Q": p}
	ls, err := s.list(r.Context(), p.DLQ, deadletter.ListOptions{Filter: flt, Limit: 1, Detail: true})
	if err != nil {
		s.render(w, r, "message", "Dead letter", data, s.errText(err))
		return
	}
	if len(ls.Entries) == 0 {
		s.renderCode(w, r, http.StatusNotFound, "message", "Dead letter", data, "no such dead letter (replayed, purged, or never there)")
		return
	}
	e := ls.Entries[0]
	var hs []headerRow
	for k, v := range e.Headers {
		hs = append(hs, headerRow{k, s.clean(showHeader(v))})
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].Key < hs[j].Key })
	kind, body := bodyView(e)
	data["E"] = e
	data["Headers"] = hs
	data["BodyKind"], data["Body"] = kind, body
	data["Group"] = deadletter.GroupKey(e)
	data["Pattern"] = deadletter.NormalizeError(e.Error)
	s.render(w, r, "message", "Dead letter "+e.MessageID, data, "")
}

// scope is what an action applies to.
type scope struct {
	Action string // replay, archive, purge
	Kind   string // all, group, message
	Group  string
	ID     string
}

func parseScope(r *http.Request) (scope, error) {
	sc := scope{Action: r.FormValue("action"), Group: r.FormValue("group"), ID: r.FormValue("id")}
	switch sc.Action {
	case "replay", "archive", "purge":
	default:
		return sc, fmt.Errorf("unknown action %q", sc.Action)
	}
	switch {
	case sc.Group != "" && sc.ID != "":
		return sc, errors.New("name a group or a message, not both")
	case sc.Group != "":
		sc.Kind = "group"
	case sc.ID != "":
		sc.Kind = "message"
	default:
		sc.Kind = "all"
	}
	return sc, nil
}

func (sc scope) filter() deadletter.Filter {
	switch sc.Kind {
	case "group":
		return deadletter.InGroup(sc.Group)
	case "message":
		return deadletter.WithMessageID(sc.ID)
	}
	return nil
}

// count is how many dead letters (and further copies) the scope selects.
func (s *Server) count(ctx context.Context, p queuePair, sc scope) (n, copies, total int, g *deadletter.Group, err error) {
	ls, err := s.list(ctx, p.DLQ, deadletter.ListOptions{Filter: sc.filter(), Limit: -1})
	if err != nil {
		return 0, 0, 0, nil, err
	}
	for _, e := range ls.Entries {
		n++
		copies += e.Duplicates
	}
	if sc.Kind == "group" && len(ls.Groups) == 1 {
		g = &ls.Groups[0]
	}
	return n, copies, ls.Total, g, nil
}

// pairScope is the queue pair and the scope a confirmation or an action
// names; ok is false once the request was refused.
func (s *Server) pairScope(w http.ResponseWriter, r *http.Request) (queuePair, scope, bool) {
	p, ok := s.pair(w, r)
	if !ok {
		return queuePair{}, scope{}, false
	}
	sc, err := parseScope(r)
	if err != nil {
		s.refuse(w, r, http.StatusBadRequest, err.Error())
		return queuePair{}, scope{}, false
	}
	return p, sc, true
}

func (s *Server) confirmPage(w http.ResponseWriter, r *http.Request) {
	p, sc, ok := s.pairScope(w, r)
	if !ok {
		return
	}
	data := map[string]any{"Q": p, "S": sc, "Archive": deadletter.ArchiveName(p.DLQ)}
	if job := s.busyJob(p.DLQ); job != "" {
		data["Job"] = job
		s.render(w, r, "confirm", "Confirm", data, "an operation is running on this queue")
		return
	}
	n, copies, total, g, err := s.count(r.Context(), p, sc)
	if err != nil {
		s.render(w, r, "confirm", "Confirm", data, s.errText(err))
		return
	}
	if sc.Action == "purge" && sc.Kind == "all" {
		n, copies = total, 0
	}
	data["N"], data["Copies"], data["Total"], data["G"] = n, copies, total, g
	s.render(w, r, "confirm", "Confirm "+sc.Action, data, "")
}

func (s *Server) act(w http.ResponseWriter, r *http.Request) {
	p, sc, ok := s.pairScope(w, r)
	if !ok {
		return
	}
	expect, err := strconv.Atoi(r.FormValue("expect"))
	if err != nil || expect < 0 {
		s.refuse(w, r, http.StatusBadRequest, "no confirmed count: go through the confirmation page")
		return
	}
	desc := fmt.Sprintf("%s %s of %s", sc.Action, sc.Kind, p.DLQ)
	switch sc.Kind {
	case "group":
		desc = fmt.Sprintf("%s group %s of %s", sc.Action, sc.Group, p.DLQ)
	case "message":
		desc = fmt.Sprintf("%s message %q of %s", sc.Action, sc.ID, p.DLQ)
	}
	j, err := s.start(p, desc, expect, func(ctx context.Context, j *job) (string, error) {
		return s.run(ctx, j, p, sc, expect)
	})
	if err != nil {
		s.refuse(w, r, http.StatusConflict, err.Error())
		return
	}
	s.log.Info("console action", "action", sc.Action, "scope", sc.Kind, "group", sc.Group, "message_id", sc.ID,
		"queue", p.DLQ, "confirmed", expect, "job", j.ID, "remote", r.RemoteAddr)
	http.Redirect(w, r, "/jobs/"+j.ID, http.StatusSeeOther)
}

// run performs an action (in a job).
func (s *Server) run(ctx context.Context, j *job, p queuePair, sc scope, expect int) (string, error) {
	c, err := deadletter.Open(s.cfg.AMQPURL)
	if err != nil {
		return "", err
	}
	defer c.Close()
	progress := func() { j.Done.Add(1) }
	switch sc.Action {
	case "replay":
		// At most the confirmed count: what arrived since is not replayed.
		res, err := c.Replay(ctx, deadletter.ReplayOptions{DLQ: p.DLQ, WorkQueue: p.Work, Filter: sc.filter(), Limit: expect,
			Publisher: s.pub, Progress: progress})
		sum := fmt.Sprintf("replayed %d to work queue %s, duplicates dropped %d, failed %d", len(res.Replayed), p.Work, len(res.Duplicates), len(res.Failed))
		for _, f := range res.Failed {
			sum += fmt.Sprintf("; %s: %s", display.OrDash(f.MessageID), f.Error)
		}
		return sum, err
	case "purge":
		if sc.Kind == "all" {
			n, err := c.Count(p.DLQ)
			if err != nil {
				return "", err
			}
			if n > expect {
				return "", fmt.Errorf("%s holds %d messages now, %d were confirmed: nothing purged; confirm again", p.DLQ, n, expect)
			}
			purged, err := c.Purge(p.DLQ)
			j.Done.Store(int64(purged))
			return fmt.Sprintf("purged %d message(s) from %s", purged, p.DLQ), err
		}
		res, err := c.Remove(ctx, deadletter.RemoveOptions{DLQ: p.DLQ, Filter: sc.filter(), Limit: expect, Progress: progress})
		return fmt.Sprintf("deleted %d dead letter(s) and %d duplicate copies from %s", res.Removed, res.Copies, p.DLQ), err
	case "archive":
		to := deadletter.ArchiveName(p.DLQ)
		res, err := c.Remove(ctx, deadletter.RemoveOptions{DLQ: p.DLQ, ArchiveTo: to, Filter: sc.filter(), Limit: expect,
			Publisher: s.pub, Progress: progress})
		return fmt.Sprintf("archived %d dead letter(s) and %d duplicate copies to %s, failed %d", res.Removed, res.Copies, to, len(res.Failed)), err
	}
	return "", fmt.Errorf("unknown action %q", sc.Action)
}

func (s *Server) jobPage(w http.ResponseWriter, r *http.Request) {
	j := s.jobs.get(r.PathValue("id"))
	if j == nil {
		s.refuse(w, r, http.StatusNotFound, "no such job")
		return
	}
	v := j.view()
	v.Err = s.clean(v.Err)
	v.Summary = s.clean(v.Summary)
	s.render(w, r, "job", "Job "+j.ID, map[string]any{"J": v, "Q": j.Queue}, "")
}
