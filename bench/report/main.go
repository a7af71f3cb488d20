// Command report turns `go test -bench` output from the bench module into
// docs/BENCHMARKS.md: medians and min/max of each case over its repetitions,
// ratios against the raw amqp091-go ack-each consumer of the same run, and
// the machine facts.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	in := flag.String("in", "-", "go test -bench output ('-' for stdin)")
	out := flag.String("out", "../docs/BENCHMARKS.md", "markdown file to write")
	cmdline := flag.String("cmd", "make bench", "the command that produced the input")
	baseline := flag.String("baseline", "Consume/raw-ack-each", "case the ratios are against")
	tables := flag.Bool("tables", true, "rewrite the tables from -in (false: keep the file's text, only rewrite the charts and the scale section)")
	charts := flag.String("charts", "", "folder to write the SVG charts into (empty: no charts)")
	scale := flag.String("scale", "", "the scale run's raw file (bench TestScale, make bench-scale): rewrite the scale section and its charts")
	scaleCmd := flag.String("scale-cmd", "make bench-scale", "the command that produced -scale")
	flag.Parse()
	if err := run(options{in: *in, out: *out, cmd: *cmdline, baseline: *baseline, tables: *tables, charts: *charts, scale: *scale, scaleCmd: *scaleCmd}, os.Stdout); err != nil {
		fatal(err)
	}
}

type options struct {
	in, out, cmd, baseline string
	tables                 bool
	charts, scale          string
	scaleCmd               string
}

func open(path string) (io.ReadCloser, error) {
	if path == "-" {
		return io.NopCloser(os.Stdin), nil
	}
	return os.Open(path)
}

// run writes the report o asks for and prints the markdown to stdout.
func run(o options, stdout io.Writer) error {
	f, err := open(o.in)
	if err != nil {
		return err
	}
	runs, order, err := parse(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", o.in, err)
	}
	if len(runs) == 0 {
		return fmt.Errorf("%s: no benchmark results in the input", o.in)
	}
	old, err := os.ReadFile(o.out)
	if err != nil && (!os.IsNotExist(err) || !o.tables) {
		return err
	}
	md := string(old)
	if o.tables {
		md = render(runs, order, o.baseline, o.cmd)
		// Measurements that are not benchmarks of this module live below
		// the marker in the existing file and are kept.
		if i := strings.Index(string(old), keptMarker); i >= 0 {
			md += "\n" + string(old[i:])
		}
	}
	if o.charts != "" {
		bc := benchCharts(runs, order, o.baseline)
		files := map[string]string{}
		for _, c := range bc {
			files[c.file] = c.svg
		}
		if _, err := writeCharts(o.charts, files); err != nil {
			return err
		}
		if md, err = upsertBlock(md, "charts", chartsMarkdown(bc), false); err != nil {
			return err
		}
	}
	if o.scale != "" {
		f, err := os.Open(o.scale)
		if err != nil {
			return err
		}
		sr, err := parseScale(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", o.scale, err)
		}
		var names []string
		if o.charts != "" {
			if names, err = writeCharts(o.charts, scaleCharts(sr)); err != nil {
				return err
			}
		}
		if md, err = upsertBlock(md, "scale", renderScale(sr, o.scaleCmd, names), true); err != nil {
			return err
		}
	}
	if err := os.WriteFile(o.out, []byte(md), 0o644); err != nil {
		return err
	}
	_, err = io.WriteString(stdout, md)
	return err
}

const keptMarker = "<!-- kept: sections below are not regenerated -->"

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "report:", err)
	os.Exit(1)
}

// sample is one repetition of one case: metric unit → value.
type sample map[string]float64

var lineRE = regexp.MustCompile(`^Benchmark(\S+?)(?:-\d+)?\s+(\d+)\s+(.*)$`)

var resultRE = regexp.MustCompile(`^Benchmark\S+\s+\d`)

// parse reads go test -bench output: every "BenchmarkName-P  N  v unit …"
// line is one repetition. A result line that does not parse (a count or a
// value that is not a number, a value without its unit) or a FAIL line is
// an error naming the line: a damaged file must not make a quiet report.
func parse(r io.Reader) (map[string][]sample, []string, error) {
	runs := map[string][]sample{}
	var order []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "--- FAIL") || strings.HasPrefix(line, "FAIL") {
			return nil, nil, fmt.Errorf("line %d: the benchmark run failed: %q", lineNo, line)
		}
		m := lineRE.FindStringSubmatch(line)
		if m == nil {
			if resultRE.MatchString(line) {
				return nil, nil, fmt.Errorf("line %d: malformed benchmark result %q", lineNo, line)
			}
			continue // go test's other output: goos, pkg, PASS, a name alone
		}
		name := m[1]
		fields := strings.Fields(m[3])
		if len(fields)%2 != 0 {
			return nil, nil, fmt.Errorf("line %d: %s: %d fields after the count, want value/unit pairs", lineNo, name, len(fields))
		}
		n, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			return nil, nil, fmt.Errorf("line %d: %s: count %q: %w", lineNo, name, m[2], err)
		}
		s := sample{"n": n}
		for i := 0; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				return nil, nil, fmt.Errorf("line %d: %s: value %q of %s is not a number", lineNo, name, fields[i], fields[i+1])
			}
			s[fields[i+1]] = v
		}
		if _, seen := runs[name]; !seen {
			order = append(order, name)
		}
		runs[name] = append(runs[name], s)
	}
	return runs, order, sc.Err()
}

func stats(ss []sample, unit string) (med, lo, hi float64, ok bool) {
	var vs []float64
	for _, s := range ss {
		if v, has := s[unit]; has {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return 0, 0, 0, false
	}
	sort.Float64s(vs)
	n := len(vs)
	if n%2 == 1 {
		med = vs[n/2]
	} else {
		med = (vs[n/2-1] + vs[n/2]) / 2
	}
	return med, vs[0], vs[n-1], true
}

// section is one table of the report: the cases whose top-level benchmark
// is in groups, with ratios against base.
type section struct {
	title, intro string
	groups       []string
	base         string
	rate         string // "msgs/s" or "rows/s"
}

var sections = []section{
	{"Consume", "Consume throughput and the handler-visible overhead per delivery (p50/p99 of the time a delivery spends in idemq's middleware outside the user handler, µs). `-dup20`: 20% of the messages repeat an earlier ID.",
		[]string{"Consume", "Dedup", "RedisTuning", "Inbox", "Bloom", "Watermill"}, "Consume/raw-ack-each", "msgs/s"},
	{"Publish", "Publishing persistent 256-byte messages, each confirmed by the broker (mandatory, as idemq's publisher does).",
		[]string{"Publish"}, "Publish/raw-confirm-window-256", "msgs/s"},
	{"Gate (deduplicating forwarder)", "`idemq gate` with the Redis store: consume, claim, publish to the output queue with confirms, complete, ack. Ratios against a raw amqp091-go forwarder doing the same broker work without dedup (200 confirms in flight, ack each after its confirm); the targets below compare with Consume/raw-ack-each.",
		[]string{"Gate"}, "Gate/raw-forward-ack-each", "msgs/s"},
	{"Outbox relay (PostgreSQL)", "Rows committed to the outbox, published with confirms and marked sent; commit → delivery latency with LISTEN/NOTIFY and with polling. Ratios against raw confirmed publishing (Publish/raw-confirm-window-256) of the same run.",
		[]string{"Relay"}, "Publish/raw-confirm-window-256", "rows/s"},
	{"PostgreSQL round trips", "What bounds the batch inbox with a statement per delivery: the same one-row INSERT, 50 to a transaction, sent a round trip each (an Inbox.Batch handler's pgx Exec) or queued in one pgx.Batch per transaction (the pipelined Inbox.BatchFunc handler). The client's and the PostgreSQL backend's CPU per statement are in the extra column.",
		[]string{"PostgresRoundTrip"}, "PostgresRoundTrip/exec-each", "stmts/s"},
}

func group(name string) string {
	if i := strings.Index(name, "/"); i >= 0 {
		return name[:i]
	}
	return name
}

func render(runs map[string][]sample, order []string, baseline, cmdline string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmarks\n\n")
	fmt.Fprintf(&b, "Written by `%s` on %s. Every case ran in the same run, against the same\n", cmdline, time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "local services, on a queue pre-filled with persistent %d-byte messages\n", 256)
	fmt.Fprintf(&b, "(prefetch 200). Each case is repeated; the tables show the median and the\n")
	fmt.Fprintf(&b, "min–max of the repetitions, and ratios of medians against the raw\namqp091-go baseline of the same run.\n\n")
	placed := map[string]bool{}
	for _, sec := range sections {
		if sec.base == "" || sec.groups[0] == "Consume" {
			if sec.groups[0] == "Consume" {
				sec.base = baseline
			}
		}
		var names []string
		for _, name := range order {
			for _, g := range sec.groups {
				if group(name) == g {
					names = append(names, name)
				}
			}
		}
		if len(names) == 0 {
			continue
		}
		fmt.Fprintf(&b, "## %s\n\n%s\n\n", sec.title, sec.intro)
		renderTable(&b, runs, names, sec.base, sec.rate)
		for _, n := range names {
			placed[n] = true
		}
	}
	var rest []string
	for _, name := range order {
		if !placed[name] {
			rest = append(rest, name)
		}
	}
	if len(rest) > 0 {
		fmt.Fprintf(&b, "## Other\n\n")
		renderTable(&b, runs, rest, baseline, "msgs/s")
	}
	if t := targets(runs); t != "" {
		fmt.Fprintf(&b, "## Targets (this run)\n\n%s\n", t)
	}
	fmt.Fprintf(&b, "## Machine\n\n")
	fmt.Fprintf(&b, "- CPU cores: %d (shared by the broker, Redis, PostgreSQL and the benchmark)\n", runtime.NumCPU())
	fmt.Fprintf(&b, "- %s\n", runtime.Version())
	for _, v := range versions() {
		fmt.Fprintf(&b, "- %s\n", v)
	}
	fmt.Fprintf(&b, "\n## Reading\n\n%s\n", reading)
	fmt.Fprintf(&b, "\nLoopback round trips are noisy (±20%% between runs): compare ratios within\none run, not absolute rates across runs.\n")
	return b.String()
}

// renderTable writes one markdown table of the named cases.
func renderTable(b *strings.Builder, runs map[string][]sample, names []string, baseline, rate string) {
	base, _, _, hasBase := stats(runs[baseline], rate)
	if !hasBase {
		// The relay's rows/s against a publisher's msgs/s.
		base, _, _, hasBase = stats(runs[baseline], "msgs/s")
	}
	ratioHead := "× baseline"
	if hasBase {
		ratioHead = "× " + shortName(baseline)
	}
	fmt.Fprintf(b, "| case | runs | %s (median) | min–max | %s | CPU s / 10k | p50 | p99 | extra |\n", rate, ratioHead)
	fmt.Fprintf(b, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, name := range names {
		ss := runs[name]
		med, lo, hi, ok := stats(ss, rate)
		if !ok {
			med, lo, hi, ok = stats(ss, "msgs/s")
		}
		val, rng, ratio := "—", "—", "—"
		if ok {
			val, rng = human(med), human(lo)+"–"+human(hi)
			if hasBase && base > 0 {
				ratio = fmt.Sprintf("%.2f", med/base)
			}
		}
		cpu := "—"
		if c, _, _, ok := stats(ss, "cpu-s/10k"); ok {
			cpu = fmt.Sprintf("%.3f", c)
		}
		p50, p99 := latency(ss, "p50"), latency(ss, "p99")
		var extra []string
		for _, unit := range extraUnits(ss) {
			v, _, _, _ := stats(ss, unit)
			extra = append(extra, fmt.Sprintf("%s %s", human(v), unit))
		}
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", shortCase(name), len(ss), val, rng, ratio, cpu, p50, p99, strings.Join(extra, ", "))
	}
	fmt.Fprintln(b)
}

// latency is the median of a p50-us/p50-ms style metric with its unit.
func latency(ss []sample, p string) string {
	for _, u := range []string{"us", "ms"} {
		if v, _, _, ok := stats(ss, p+"-"+u); ok {
			if u == "us" {
				u = "µs"
			}
			return human(v) + " " + u
		}
	}
	return "—"
}

// shortCase drops the "Consume/"-style group from the case name.
func shortCase(name string) string {
	g := group(name)
	if g == name {
		return name
	}
	return strings.ToLower(g) + ": " + name[len(g)+1:]
}

// targets checks the ratios in this run and returns a markdown
// table, or "" when the run lacks the cases.
func targets(runs map[string][]sample) string {
	med := func(name, unit string) (float64, bool) {
		v, _, _, ok := stats(runs[name], unit)
		return v, ok && v > 0
	}
	best := func(prefix string, exclude ...string) (string, float64) {
		var bn string
		var bv float64
	next:
		for name := range runs {
			if !strings.HasPrefix(name, prefix) {
				continue
			}
			for _, e := range exclude {
				if strings.Contains(name, e) {
					continue next
				}
			}
			if v, ok := med(name, "msgs/s"); ok && v > bv {
				bn, bv = name, v
			}
		}
		return bn, bv
	}
	var rows []string
	row := func(target string, got, want float64, how string) {
		met := "no"
		if got >= want {
			met = "yes"
		}
		rows = append(rows, fmt.Sprintf("| %s | %.2f× (%s) | %s |", target, got, how, met))
	}
	raw, okRaw := med("Consume/raw-ack-each", "msgs/s")
	multi, okMulti := med("Consume/raw-multiple-ack-50", "msgs/s")
	if okRaw {
		if v, ok := med("Dedup/idemq-dedup-redis", "msgs/s"); ok {
			row("Redis dedup ≥ 1.0× raw ack-each (default config)", v/raw, 1.0, "Dedup/idemq-dedup-redis")
			if okMulti {
				row("Redis dedup ≥ 0.6× raw multiple-ack (default config)", v/multi, 0.6, "Dedup/idemq-dedup-redis")
			}
		}
		if n, v := best("Dedup/idemq-dedup-redis", "dup20"); n != "" {
			if tn, tv := best("RedisTuning/"); tv > v {
				n, v = tn, tv
			}
			row("Redis dedup ≥ 1.0× raw ack-each (best config)", v/raw, 1.0, n)
			if okMulti {
				row("Redis dedup ≥ 0.8× raw multiple-ack (best config)", v/multi, 0.8, n)
			}
		}
		// The same one-row effect per message, three ways: a statement
		// (a round trip) per delivery (Inbox.Batch); the same statements
		// queued in one pipeline by a batch handler (Inbox.BatchFunc with
		// a pgx.Batch); one statement for the batch (BatchFunc, unnest).
		if n, v := best("Inbox/idemq-inbox-postgres-batch-"); n != "" {
			row("batched inbox ≥ 0.7× raw ack-each (best batch size; a statement and a round trip per delivery)", v/raw, 0.7, n)
		}
		if n, v := best("Inbox/idemq-inbox-postgres-batchfunc-pipelined-"); n != "" {
			row("batched inbox, a statement per delivery in one pipeline (BatchFunc + pgx.Batch) ≥ 0.7× raw ack-each", v/raw, 0.7, n)
		}
		if n, v := best("Inbox/idemq-inbox-postgres-batchfunc-", "pipelined"); n != "" {
			row("batched inbox, one effect statement per batch (BatchFunc) ≥ 0.7× raw ack-each", v/raw, 0.7, n)
		}
	}
	if c, ok := med("Dedup/idemq-dedup-redis", "cpu-s/10k"); ok {
		if c0, ok := med("Consume/idemq-noop", "cpu-s/10k"); ok {
			// Lower is better: met when the ratio is at most 2.
			met := "no"
			if c/c0 <= 2 {
				met = "yes"
			}
			rows = append(rows, fmt.Sprintf("| consumer CPU per message, Redis dedup ≤ 2× no dedup | %.2f× (%.3f vs %.3f CPU s / 10k) | %s |", c/c0, c, c0, met))
		}
	}
	if v, ok := med("Dedup/idemq-dedup-redis", "msgs/s"); ok {
		if rc, ok := med("Dedup/recipe-setnx-ack", "msgs/s"); ok {
			rows = append(rows, fmt.Sprintf("| idemq Redis dedup (default config) against the SET NX recipe (for reference) | %.2f× (Dedup/idemq-dedup-redis vs Dedup/recipe-setnx-ack) | — |", v/rc))
		}
	}
	if v, ok := med("Gate/gate-redis", "msgs/s"); ok {
		if okRaw {
			row("gate (Redis dedup) ≥ 0.5× raw ack-each", v/raw, 0.5, "Gate/gate-redis")
		}
		if fw, ok := med("Gate/raw-forward-ack-each", "msgs/s"); ok {
			row("gate (Redis dedup) ≥ 0.5× raw forward (consume + confirmed publish)", v/fw, 0.5, "Gate/gate-redis")
		}
	}
	if wm, ok := med("Watermill/watermill-prefetch200-dedup-redis", "msgs/s"); ok {
		if v, ok := med("Dedup/idemq-dedup-redis", "msgs/s"); ok {
			row("idemq Redis dedup ≥ 3× Watermill + Deduplicator (default config)", v/wm, 3, "Dedup/idemq-dedup-redis")
		}
		if n, v := best("Dedup/idemq-dedup-redis", "dup20"); n != "" {
			if tn, tv := best("RedisTuning/"); tv > v {
				n, v = tn, tv
			}
			row("idemq Redis dedup ≥ 3× Watermill + Deduplicator (best idemq config)", v/wm, 3, n)
		}
	}
	for _, sfx := range []string{"", "-autopipeline"} {
		if exact, ok := med("Bloom/exact-redis"+sfx, "msgs/s"); ok {
			if v, ok := med("Bloom/redisbloom-store"+sfx, "msgs/s"); ok {
				row("tiered Bloom store not slower than the exact Redis store"+strings.ReplaceAll(sfx, "-", " "), v/exact, 0.95,
					"Bloom/redisbloom-store"+sfx+" vs Bloom/exact-redis"+sfx)
			}
		}
	}
	if v, ok := med("Relay/throughput-relays-1", "rows/s"); ok {
		if pub, ok := med("Publish/raw-confirm-window-256", "msgs/s"); ok {
			row("relay (1 process) ≥ 0.95× raw confirmed publishing (window 256)", v/pub, 0.95, "Relay/throughput-relays-1 vs Publish/raw-confirm-window-256")
		}
		if v3, ok := med("Relay/throughput-relays-3", "rows/s"); ok {
			row("three relays ≥ one (5% for noise)", v3/v, 0.95, "Relay/throughput-relays-3 vs Relay/throughput-relays-1")
		}
		if pub, ok := med("Publish/raw-confirm-window-256", "msgs/s"); ok {
			if vd, ok := med("Relay/throughput-relays-1-delete-sent", "rows/s"); ok {
				rows = append(rows, fmt.Sprintf("| relay (1 process) with StoreConfig.DeleteSent against raw confirmed publishing (for reference) | %.2f× (Relay/throughput-relays-1-delete-sent vs Publish/raw-confirm-window-256) | — |", vd/pub))
			}
		}
	}
	if plain, ok := med("ConsumeObserved/idemq-noop-plain", "msgs/s"); ok {
		if v, ok := med("ConsumeObserved/idemq-noop-metrics-tracing-1pct", "msgs/s"); ok {
			row("metrics and tracing on (1% of traces sampled): < 5% off", v/plain, 0.95,
				"ConsumeObserved/idemq-noop-metrics-tracing-1pct vs ConsumeObserved/idemq-noop-plain")
		}
	}
	if v, ok := med("Relay/latency-notify", "p99-ms"); ok {
		rows = append(rows, fmt.Sprintf("| commit → publish p99 < 50 ms with LISTEN/NOTIFY | %s ms | %s |", human(v), yes(v < 50)))
	}
	if len(rows) == 0 {
		return ""
	}
	return "Ratios of medians; \"not slower\" allows 5% for noise.\n\n| target | measured | met |\n| --- | --- | --- |\n" + strings.Join(rows, "\n") + "\n"
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

var standard = map[string]bool{"n": true, "ns/op": true, "msgs/s": true, "rows/s": true, "stmts/s": true, "cpu-s/10k": true, "B/op": true, "allocs/op": true,
	"p50-us": true, "p99-us": true, "p50-ms": true, "p99-ms": true}

func extraUnits(ss []sample) []string {
	set := map[string]bool{}
	for _, s := range ss {
		for u := range s {
			if !standard[u] {
				set[u] = true
			}
		}
	}
	var out []string
	for u := range set {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

func shortName(s string) string {
	if i := strings.LastIndex(s, "/"); i >= 0 {
		return s[i+1:]
	}
	return s
}

func human(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 1:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

func versions() []string {
	var out []string
	try := func(label string, name string, args ...string) {
		o, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return
		}
		line := strings.TrimSpace(strings.SplitN(string(o), "\n", 2)[0])
		if line != "" {
			out = append(out, label+": "+line)
		}
	}
	node := os.Getenv("IDEMQ_RABBITMQ_NODE")
	if node == "" {
		node = "rabbit@localhost"
	}
	try("RabbitMQ", "rabbitmqctl", "-q", "-n", node, "version")
	try("Redis", "redis-server", "--version")
	try("PostgreSQL", "postgres", "--version")
	try("MariaDB", "mariadbd", "--version")
	return out
}

const reading = `- The RabbitMQ queue process is the ceiling (about one of the 2 cores).
  idemq's consumer without dedup is close to a raw consumer that multiple-acks
  every 50: coalesced acks spare the broker one ack frame per message.
- A dedup store adds two store calls per new message (claim, complete) and
  one per duplicate. The memory store costs microseconds. With Redis the
  guard groups the calls of its concurrent workers (group commit without a
  timer), and claims of new deliveries share their batch with completes of
  finished ones (dedup.MixedBatchStore): on a single-node client a batch is
  one EVALSHA of a script that does every SET NX / complete of the batch,
  so Redis pays one script call per batch instead of a command (or a
  script) per key, and go-redis reads one reply. With Pipeline.Guard set
  and Workers unset the consumer runs the guard's suggestion, 64 workers
  (Dedup/idemq-dedup-redis is that default; RedisTuning varies it, and
  redis-two-round-trips keeps claims and completes in batches of their
  own). Recipe rows: a raw amqp091-go consumer doing SET NX then ack on
  one goroutine, what blog posts show — one Redis round trip per message,
  no lease (a crash between the SET and the effect loses the message). The
  p50/p99 columns are the time a delivery spends in idemq outside the
  handler, including waiting for a worker and for Redis.
- The Bloom tier's single-script store (redisbloom-store) batches the same
  way; its Lua is heavier than the exact store's SET (Redis commandstats:
  ~26 µs per EVALSHA) but it writes ~45× less memory per remembered ID, and
  on this machine it keeps up with the exact store. The two-store
  combinations (tiered-redis-leases-*) are not batched: each call goes to
  the lease store and the filter separately.
- The PostgreSQL store commits twice per message (claim, complete): it is
  for teams that want no Redis, not for throughput; the inbox (one
  transaction that holds the effect and the row) is the SQL mode to use. The
  batched inbox writes a batch's inbox rows in one multi-row INSERT and runs
  the handlers without savepoints (a failure reruns the batch with them), so
  a message costs its own effect's round trip plus a share of one INSERT and
  one commit; the consumer's CPU per message is less than half the
  transaction-per-message inbox's, and the rest is PostgreSQL and RabbitMQ
  sharing the same 2 cores. The batchfunc rows write the same effect in one
  round trip per batch instead of one per delivery: one statement for the
  batch (batchfunc-50), or the per-delivery statements queued in one
  pgx.Batch (batchfunc-pipelined-50); PostgresRoundTrip prices the round
  trip they save.
- Watermill with its Deduplicator on Redis pays one SET NX per message plus
  its router overhead; its default prefetch of 1 is the usual first surprise.
- Publishing: the idemq publisher with many concurrent callers (each waits
  for its own confirm) is close to a raw amqp091-go publisher keeping 256
  confirms in flight; one caller publishing sequentially pays a confirm round
  trip (a broker fsync) per message, as raw does.
- The relay (README configuration: every setting at its default) publishes
  through the same publisher with up to BatchSize×Concurrency (256×8)
  confirms in flight while the next batch is claimed, so the broker always
  has a full window; per batch it runs one claim UPDATE … RETURNING and one
  mark UPDATE, both without waiting for a WAL fsync on PostgreSQL
  (synchronous_commit off for those statements). What it cannot avoid is
  PostgreSQL's CPU for two row updates per message on the same 2 cores as
  the broker, which raw publishing does not pay; three relays contend for
  the same claim index and do not add throughput on 2 cores.`
