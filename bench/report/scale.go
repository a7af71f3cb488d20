package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
)

// The scale run's raw file (bench/scale_test.go, `make bench-scale`): one
// record per line, "scale-<kind> key=value …". Kinds: run (first), case,
// sample, mark, done, end. Other lines (go test's own) are ignored.

type scaleRun struct {
	attrs map[string]string // the first scale-run line
	end   map[string]string // the last scale-end line; nil when the run did not finish
	cases []*scaleCase
	// parts are the processes whose output the file holds (cases may be run
	// apart, IDEMQ_SCALE_CASES, and their files concatenated): each
	// scale-run line and the scale-end after it, nil when that process did
	// not finish.
	parts []runPart
}

type runPart struct{ start, end map[string]string }

type scaleCase struct {
	name    string
	part    int               // index in scaleRun.parts
	n, step float64           // its messages, and how many between two marks
	attrs   map[string]string // the scale-case line
	done    map[string]string // the scale-done line; nil when it did not finish
	marks   []scaleMark
	samples []scaleSample
}

type scaleMark struct{ msgs, t, cpu float64 }

type scaleSample struct {
	t, msgs, rss, heap, load1 float64
	redis, inboxBytes, rows   float64 // -1: not sampled
}

func parseKV(fields []string, lineNo int) (map[string]string, error) {
	kv := map[string]string{}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("line %d: field %q is not key=value", lineNo, f)
		}
		kv[k] = v
	}
	return kv, nil
}

// num reads a numeric field; a missing one is an error unless def is given.
func num(kv map[string]string, key string, lineNo int, def ...float64) (float64, error) {
	v, ok := kv[key]
	if !ok {
		if len(def) > 0 {
			return def[0], nil
		}
		return 0, fmt.Errorf("line %d: no %s=", lineNo, key)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, fmt.Errorf("line %d: %s=%q is not a number", lineNo, key, v)
	}
	return f, nil
}

func parseScale(r io.Reader) (*scaleRun, error) {
	run := &scaleRun{}
	byName := map[string]*scaleCase{}
	caseOf := func(kv map[string]string, lineNo int) (*scaleCase, error) {
		c, ok := byName[kv["case"]]
		if !ok {
			return nil, fmt.Errorf("line %d: case %q has no scale-case line before it", lineNo, kv["case"])
		}
		return c, nil
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || !strings.HasPrefix(fields[0], "scale-") {
			continue
		}
		kv, err := parseKV(fields[1:], lineNo)
		if err != nil {
			return nil, err
		}
		if fields[0] != "scale-run" && run.attrs == nil {
			return nil, fmt.Errorf("line %d: %s before the scale-run line", lineNo, fields[0])
		}
		switch fields[0] {
		case "scale-run":
			if _, err := num(kv, "messages", lineNo); err != nil {
				return nil, err
			}
			if _, err := num(kv, "step", lineNo); err != nil {
				return nil, err
			}
			if run.attrs == nil {
				run.attrs = kv
			}
			run.parts = append(run.parts, runPart{start: kv})
		case "scale-case":
			if kv["case"] == "" {
				return nil, fmt.Errorf("line %d: scale-case without case=", lineNo)
			}
			msgs, err := num(kv, "messages", lineNo)
			if err != nil {
				return nil, err
			}
			part := run.parts[len(run.parts)-1]
			c := &scaleCase{name: kv["case"], attrs: kv, part: len(run.parts) - 1, n: msgs, step: f(part.start, "step")}
			byName[c.name] = c
			run.cases = append(run.cases, c)
		case "scale-mark":
			c, err := caseOf(kv, lineNo)
			if err != nil {
				return nil, err
			}
			var m scaleMark
			for _, f := range []struct {
				p   *float64
				key string
			}{{&m.msgs, "msgs"}, {&m.t, "t"}, {&m.cpu, "cpu"}} {
				if *f.p, err = num(kv, f.key, lineNo); err != nil {
					return nil, err
				}
			}
			c.marks = append(c.marks, m)
		case "scale-sample":
			c, err := caseOf(kv, lineNo)
			if err != nil {
				return nil, err
			}
			var s scaleSample
			for _, f := range []struct {
				p   *float64
				key string
				def []float64
			}{{&s.t, "t", nil}, {&s.msgs, "msgs", nil}, {&s.rss, "rss", nil}, {&s.heap, "heap", []float64{0}}, {&s.load1, "load1", []float64{0}},
				{&s.redis, "redis-used", []float64{-1}}, {&s.inboxBytes, "inbox-bytes", []float64{-1}}, {&s.rows, "inbox-rows", []float64{-1}}} {
				if *f.p, err = num(kv, f.key, lineNo, f.def...); err != nil {
					return nil, err
				}
			}
			c.samples = append(c.samples, s)
		case "scale-done":
			c, err := caseOf(kv, lineNo)
			if err != nil {
				return nil, err
			}
			for _, k := range []string{"msgs", "t", "cpu"} {
				if _, err := num(kv, k, lineNo); err != nil {
					return nil, err
				}
			}
			c.done = kv
		case "scale-end":
			run.end = kv
			run.parts[len(run.parts)-1].end = kv
		default:
			return nil, fmt.Errorf("line %d: unknown record %q", lineNo, fields[0])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if run.attrs == nil {
		return nil, fmt.Errorf("no scale-run line: not the output of the scale run (bench TestScale)")
	}
	if len(run.cases) == 0 {
		return nil, fmt.Errorf("the scale run has no case")
	}
	for _, c := range run.cases {
		// Concurrent workers may write two marks out of order.
		sort.SliceStable(c.marks, func(i, j int) bool { return c.marks[i].msgs < c.marks[j].msgs })
	}
	return run, nil
}

// messages is the largest case's count.
func (r *scaleRun) messages() float64 {
	n := 0.0
	for _, c := range r.cases {
		n = math.Max(n, c.n)
	}
	return n
}

func f(kv map[string]string, k string) float64 { v, _ := strconv.ParseFloat(kv[k], 64); return v }

// windowRate is the throughput (msgs/s) of the mark window ending at mark
// i (from the previous mark, or the start).
func (c *scaleCase) window(i int) (msgs, secs, cpu float64) {
	m := c.marks[i]
	if i == 0 {
		return m.msgs, m.t, m.cpu
	}
	p := c.marks[i-1]
	return m.msgs - p.msgs, m.t - p.t, m.cpu - p.cpu
}

// markAt is the index of the mark at exactly msgs, or -1.
func (c *scaleCase) markAt(msgs float64) int {
	for i, m := range c.marks {
		if m.msgs == msgs {
			return i
		}
	}
	return -1
}

// slices is the throughput of each tenth of the run (100k of 1M), from the
// marks at its ends; ok false when a mark is missing.
func (c *scaleCase) slices() (rates []float64, ok bool) {
	n := c.n
	prevT := 0.0
	for k := 1; k <= 10; k++ {
		i := c.markAt(n * float64(k) / 10)
		if i < 0 {
			return rates, false
		}
		rates = append(rates, n/10/(c.marks[i].t-prevT))
		prevT = c.marks[i].t
	}
	return rates, true
}

func median(vs []float64) float64 {
	s := append([]float64(nil), vs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func mb(v float64) string { return fmt.Sprintf("%.1f MB", v/1e6) }

// countLabel is 10k, 100k, 1M.
func countLabel(v float64) string { return tickLabel(v) }

// caseDoc describes the scale run's cases (bench/scale_test.go).
var caseDoc = map[string]string{
	"raw-ack-each":         "raw amqp091-go acking each message: the broker alone at that queue depth.",
	"redis-dedup-default":  "the idemq consumer with the Redis dedup guard at its default configuration (Pipeline.Guard, workers and batching left to their defaults), a no-op handler.",
	"inbox-batch-50-purge": "the batch inbox on PostgreSQL (batches of 50, 100 workers, a one-row INSERT as the effect) with Inbox.RunPurger every EVERY and a WINDOW window, so that the purge deletes rows during the run.",
}

// renderScale is the scale section's markdown (inside its block).
func renderScale(r *scaleRun, cmd string, charts []string) string {
	var b strings.Builder
	n := r.messages()
	same := true
	for _, c := range r.cases {
		same = same && c.n == n
	}
	if same {
		fmt.Fprintf(&b, "## Scale run: %s messages\n\n", countLabel(n))
	} else {
		fmt.Fprintf(&b, "## Scale run\n\n")
	}
	var starts []string
	for _, p := range r.parts {
		starts = append(starts, p.start["started"])
	}
	fmt.Fprintf(&b, "Written by `%s` from docs/bench-scale-raw.txt (started %s). Persistent %s-byte\n", cmd, strings.Join(starts, " and "), r.attrs["body"])
	fmt.Fprintf(&b, "messages through each consumer in turn, on a queue pre-filled with all of them (the\n")
	fmt.Fprintf(&b, "consumer is measured, not the publisher), prefetch %s:\n\n", r.attrs["prefetch"])
	for _, c := range r.cases {
		if d, ok := caseDoc[c.name]; ok {
			fmt.Fprintf(&b, "- `%s`, %s messages: %s\n", c.name, countLabel(c.n), strings.NewReplacer("WINDOW", r.attrs["inbox-window"], "EVERY", r.attrs["inbox-purge-every"]).Replace(d))
		}
	}
	fmt.Fprintln(&b)
	for i, p := range r.parts {
		if len(r.parts) > 1 {
			var names []string
			for _, c := range r.cases {
				if c.part == i {
					names = append(names, "`"+c.name+"`")
				}
			}
			fmt.Fprintf(&b, "Process %d (%s): load", i+1, strings.Join(names, ", "))
		} else {
			fmt.Fprintf(&b, "Load")
		}
		fmt.Fprintf(&b, " average (1, 5, 15 min) at the start %s", strings.ReplaceAll(p.start["load"], ",", ", "))
		if p.end != nil {
			fmt.Fprintf(&b, ", at the end %s; it took %s s, pre-fills included.\n", strings.ReplaceAll(p.end["load"], ",", ", "), p.end["elapsed-s"])
		} else {
			fmt.Fprintf(&b, "; it was stopped before its end (no scale-end record).\n")
		}
	}
	fmt.Fprintln(&b)

	fmt.Fprintf(&b, "| case | msgs/s (whole run) | CPU µs / msg | fill (publish) msgs/s | slowest / fastest tenth | last tenth / first | load during the case |\n")
	fmt.Fprintf(&b, "| --- | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, c := range r.cases {
		if c.done == nil {
			fmt.Fprintf(&b, "| %s | did not finish | | %s | | | |\n", c.name, c.attrs["fill-rate"])
			continue
		}
		rate, cpu := f(c.done, "msgs")/f(c.done, "t"), f(c.done, "cpu")/f(c.done, "msgs")*1e6
		spread, lastFirst := "—", "—"
		if sl, ok := c.slices(); ok {
			lo, hi := sl[0], sl[0]
			for _, v := range sl {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
			spread = fmt.Sprintf("%.2f", lo/hi)
			lastFirst = fmt.Sprintf("%.2f", sl[len(sl)-1]/sl[0])
		}
		fmt.Fprintf(&b, "| %s | %s | %.1f | %s | %s | %s | %s → %s |\n", c.name, human(rate), cpu, c.attrs["fill-rate"], spread, lastFirst,
			strings.SplitN(c.attrs["load"], ",", 2)[0], strings.SplitN(c.done["load"], ",", 2)[0])
	}
	fmt.Fprintf(&b, "\n### Throughput per tenth (msgs/s)\n\n")
	fmt.Fprintf(&b, "| tenth |")
	for _, c := range r.cases {
		fmt.Fprintf(&b, " %s (of %s) |", c.name, countLabel(c.n))
	}
	fmt.Fprintf(&b, "\n| --- |%s\n", strings.Repeat(" ---: |", len(r.cases)))
	all := make([][]float64, len(r.cases))
	for i, c := range r.cases {
		all[i], _ = c.slices()
	}
	for k := 0; k < 10; k++ {
		fmt.Fprintf(&b, "| %d |", k+1)
		for i := range r.cases {
			if k < len(all[i]) {
				fmt.Fprintf(&b, " %s |", human(all[i][k]))
			} else {
				fmt.Fprintf(&b, " — |")
			}
		}
		fmt.Fprintln(&b)
	}

	fmt.Fprintf(&b, "\n### Cost per message as the run grows\n\n")
	fmt.Fprintf(&b, "Wall time and consumer CPU per message (µs) over the window of messages (1%% of the case) ending at\n")
	fmt.Fprintf(&b, "1%%, 10%% and all of the case's messages (the first window includes connecting and the consumer's start),\n")
	fmt.Fprintf(&b, "and the CPU per message of the whole case.\n\n")
	fmt.Fprintf(&b, "| case | at 1%%: wall / CPU | at 10%%: wall / CPU | at 100%%: wall / CPU | CPU at 100%% ÷ at 10%% | whole case CPU µs / msg |\n")
	fmt.Fprintf(&b, "| --- | ---: | ---: | ---: | ---: | ---: |\n")
	for _, c := range r.cases {
		fmt.Fprintf(&b, "| %s |", c.name)
		var cpus []float64
		for _, p := range []float64{c.n / 100, c.n / 10, c.n} {
			i := c.markAt(p)
			if i < 0 {
				fmt.Fprintf(&b, " — |")
				cpus = append(cpus, 0)
				continue
			}
			m, s, cpu := c.window(i)
			fmt.Fprintf(&b, " %s: %.1f / %.1f |", countLabel(p), s/m*1e6, cpu/m*1e6)
			cpus = append(cpus, cpu/m)
		}
		ratio, whole := "—", "—"
		if cpus[1] > 0 && cpus[2] > 0 {
			ratio = fmt.Sprintf("%.2f", cpus[2]/cpus[1])
		}
		if c.done != nil {
			whole = fmt.Sprintf("%.1f", f(c.done, "cpu")/f(c.done, "msgs")*1e6)
		}
		fmt.Fprintf(&b, " %s | %s |\n", ratio, whole)
	}

	fmt.Fprintf(&b, "\n### Memory\n\n")
	fmt.Fprintf(&b, "Consumer RSS is the benchmark process (the consumer and the harness; the harness keeps an 8-byte\n")
	fmt.Fprintf(&b, "latency sample per message). Redis `used_memory` is the whole shared server (other runs use it too);\n")
	fmt.Fprintf(&b, "its growth is divided by the keys the case left (counted when they are deleted at its end).\n\n")
	fmt.Fprintf(&b, "| case | RSS start → peak → end | Go heap end | Redis used_memory start → peak → end | Redis bytes / key | inbox table: peak size, peak rows → end |\n")
	fmt.Fprintf(&b, "| --- | --- | ---: | --- | ---: | --- |\n")
	for _, c := range r.cases {
		if len(c.samples) == 0 {
			fmt.Fprintf(&b, "| %s | no samples | | | | |\n", c.name)
			continue
		}
		first, last := c.samples[0], c.samples[len(c.samples)-1]
		var peakRSS, peakRedis, peakBytes, peakRows float64
		for _, s := range c.samples {
			peakRSS, peakRedis = math.Max(peakRSS, s.rss), math.Max(peakRedis, s.redis)
			peakBytes, peakRows = math.Max(peakBytes, s.inboxBytes), math.Max(peakRows, s.rows)
		}
		redis, perKey := "—", "—"
		if first.redis >= 0 {
			redis = fmt.Sprintf("%s → %s → %s", mb(first.redis), mb(peakRedis), mb(last.redis))
			if c.done != nil && f(c.done, "redis-keys") > 0 {
				perKey = fmt.Sprintf("%.0f", (peakRedis-first.redis)/f(c.done, "redis-keys"))
			}
		}
		ib := "—"
		if peakBytes > 0 {
			ib = fmt.Sprintf("%s, %s → %s rows", mb(peakBytes), human(peakRows), human(last.rows))
		}
		fmt.Fprintf(&b, "| %s | %s → %s → %s | %s | %s | %s | %s |\n", c.name, mb(first.rss), mb(peakRSS), mb(last.rss), mb(last.heap), redis, perKey, ib)
	}
	if ic := r.caseNamed("inbox-batch-50-purge"); ic != nil && len(ic.samples) > 0 {
		fmt.Fprintf(&b, "\nThe inbox table over time (every ~10th sample):\n\n| s | messages | table size | rows |\n| ---: | ---: | ---: | ---: |\n")
		every := max(len(ic.samples)/10, 1)
		printed := ""

		for i, s := range ic.samples {
			if s.rows < 0 || (i%every != 0 && i != len(ic.samples)-1) || fmt.Sprintf("%.0f", s.t) == printed {
				continue
			}
			printed = fmt.Sprintf("%.0f", s.t)
			fmt.Fprintf(&b, "| %.0f | %s | %s | %s |\n", s.t, human(s.msgs), mb(s.inboxBytes), human(s.rows))
		}
	}
	if len(charts) > 0 {
		fmt.Fprintf(&b, "\n")
		for _, c := range charts {
			fmt.Fprintf(&b, "![%s](%s)\n\n", strings.TrimSuffix(c, ".svg"), c)
		}
	}
	return b.String()
}

func (r *scaleRun) caseNamed(name string) *scaleCase {
	for _, c := range r.cases {
		if c.name == name {
			return c
		}
	}
	return nil
}

// scaleCharts returns the scale run's charts: file name → SVG.
func scaleCharts(r *scaleRun) map[string]string {
	n := r.messages()
	var thr []series
	for _, c := range r.cases {
		s := series{name: c.name}
		for i := range c.marks {
			m, secs, _ := c.window(i)
			if secs > 0 {
				s.pts = append(s.pts, [2]float64{c.marks[i].msgs, m / secs})
			}
		}
		thr = append(thr, s)
	}
	lo, hi := math.Inf(1), 0.0
	for _, c := range r.cases {
		for _, s := range c.samples {
			if s.load1 > 0 {
				lo, hi = math.Min(lo, s.load1), math.Max(hi, s.load1)
			}
		}
	}
	load := ""
	if hi > 0 {
		load = fmt.Sprintf("1-minute load average %.1f–%.1f during the cases (the machine's cores are shared with other runs).", lo, hi)
	}
	out := map[string]string{
		"scale-throughput.svg": lineChart(fmt.Sprintf("Scale run: throughput over up to %s messages", countLabel(n)),
			"msgs/s over each window of 1% of the case's messages, against the messages done so far",
			"messages done", "msgs/s", load, thr),
	}
	var mem []series
	for _, c := range r.cases {
		rss := series{name: c.name + " RSS"}
		redis := series{name: c.name + " Redis"}
		ib := series{name: "inbox table"}
		for _, s := range c.samples {
			rss.pts = append(rss.pts, [2]float64{s.t, s.rss / 1e6})
			if s.redis >= 0 && len(c.samples) > 0 && c.samples[0].redis >= 0 {
				redis.pts = append(redis.pts, [2]float64{s.t, (s.redis - c.samples[0].redis) / 1e6})
			}
			if s.inboxBytes >= 0 {
				ib.pts = append(ib.pts, [2]float64{s.t, s.inboxBytes / 1e6})
			}
		}
		mem = append(mem, rss)
		if c.name == "redis-dedup-default" && len(redis.pts) > 0 {
			redis.name = "Redis growth (dedup)"
			mem = append(mem, redis)
		}
		if len(ib.pts) > 0 {
			mem = append(mem, ib)
		}
	}
	out["scale-memory.svg"] = lineChart("Scale run: memory over time",
		"consumer RSS per case, Redis used_memory growth during the Redis dedup case, inbox table size (pg_total_relation_size)",
		"seconds since the case started", "MB", load, mem)
	if ic := r.caseNamed("inbox-batch-50-purge"); ic != nil {
		rows := series{name: "inbox rows"}
		for _, s := range ic.samples {
			if s.rows >= 0 {
				rows.pts = append(rows.pts, [2]float64{s.t, s.rows})
			}
		}
		if len(rows.pts) > 0 {
			out["scale-inbox-rows.svg"] = lineChart("Scale run: inbox rows with the purge running",
				fmt.Sprintf("rows in idemq_inbox (count(*)), window %s, purge every %s", r.attrs["inbox-window"], r.attrs["inbox-purge-every"]),
				"seconds since the case started", "rows", "", []series{rows})
		}
	}
	return out
}
