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
	flag.Parse()
	var r io.Reader = os.Stdin
	if *in != "-" {
		f, err := os.Open(*in)
		if err != nil {
			fatal(err)
		}
		defer f.Close()
		r = f
	}
	runs, order, err := parse(r)
	if err != nil {
		fatal(err)
	}
	if len(runs) == 0 {
		fatal(fmt.Errorf("no benchmark results in the input"))
	}
	md := render(runs, order, *baseline, *cmdline)
	// Measurements that are not benchmarks of this module live below the
	// marker in the existing file and are kept.
	if old, err := os.ReadFile(*out); err == nil {
		if i := strings.Index(string(old), keptMarker); i >= 0 {
			md += "\n" + string(old[i:])
		}
	}
	if err := os.WriteFile(*out, []byte(md), 0o644); err != nil {
		fatal(err)
	}
	fmt.Print(md)
}

const keptMarker = "<!-- kept: sections below are not regenerated -->"

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "report:", err)
	os.Exit(1)
}

// sample is one repetition of one case: metric unit → value.
type sample map[string]float64

var lineRE = regexp.MustCompile(`^Benchmark(\S+?)(?:-\d+)?\s+(\d+)\s+(.*)$`)

func parse(r io.Reader) (map[string][]sample, []string, error) {
	runs := map[string][]sample{}
	var order []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := lineRE.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if m == nil {
			continue
		}
		name := m[1]
		fields := strings.Fields(m[3])
		s := sample{"n": mustFloat(m[2])}
		for i := 0; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				continue
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

func mustFloat(s string) float64 {
	v, _ := strconv.ParseFloat(s, 64)
	return v
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

func render(runs map[string][]sample, order []string, baseline, cmdline string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmarks\n\n")
	fmt.Fprintf(&b, "Written by `%s` on %s. Every case ran in the same run, against the same\n", cmdline, time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "local services, on a queue pre-filled with persistent %d-byte messages with\n", 256)
	fmt.Fprintf(&b, "unique IDs (prefetch 200). Each case is repeated; the table shows the median\n")
	fmt.Fprintf(&b, "and the min–max of the repetitions, and the ratio of medians against\n`%s`.\n\n", baseline)
	base, _, _, hasBase := stats(runs[baseline], "msgs/s")
	fmt.Fprintf(&b, "| case | runs | msgs/s (median) | min–max | × %s | CPU s / 10k msgs | extra |\n", shortName(baseline))
	fmt.Fprintf(&b, "| --- | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, name := range order {
		ss := runs[name]
		med, lo, hi, ok := stats(ss, "msgs/s")
		if !ok {
			continue
		}
		ratio := "—"
		if hasBase && base > 0 {
			ratio = fmt.Sprintf("%.2f", med/base)
		}
		cpu := "—"
		if c, _, _, ok := stats(ss, "cpu-s/10k"); ok {
			cpu = fmt.Sprintf("%.3f", c)
		}
		var extra []string
		for _, unit := range extraUnits(ss) {
			v, _, _, _ := stats(ss, unit)
			extra = append(extra, fmt.Sprintf("%s %s", human(v), unit))
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s–%s | %s | %s | %s |\n", name, len(ss), human(med), human(lo), human(hi), ratio, cpu, strings.Join(extra, ", "))
	}
	fmt.Fprintf(&b, "\n## Machine\n\n")
	fmt.Fprintf(&b, "- CPU cores: %d (shared by the broker, Redis, PostgreSQL and the benchmark)\n", runtime.NumCPU())
	fmt.Fprintf(&b, "- %s\n", runtime.Version())
	for _, v := range versions() {
		fmt.Fprintf(&b, "- %s\n", v)
	}
	fmt.Fprintf(&b, "\n## Reading\n\n%s\n", reading)
	fmt.Fprintf(&b, "\nLoopback round trips are noisy (±20%% between runs): compare ratios within\none run, not absolute rates across runs.\n")
	return b.String()
}

var standard = map[string]bool{"n": true, "ns/op": true, "msgs/s": true, "cpu-s/10k": true, "B/op": true, "allocs/op": true}

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

const reading = `- The RabbitMQ queue process is the ceiling (about one core). idemq's
  consumer without dedup matches a raw consumer that multiple-acks every 50:
  coalesced acks free the broker from one ack frame per message.
- A dedup store adds two round trips per new message (claim, complete) and
  one per duplicate. The memory store costs nothing measurable; Redis is
  bounded by round trips on a machine whose 2 cores also run the broker and
  Redis — go-redis auto-pipelining (redisstore.Config{AutoPipeline: true})
  recovers a large part of it. A pipelined claim for the whole prefetch window
  (one round trip per batch) is the next step and is not built yet.
- The PostgreSQL store commits twice per message (claim, complete): it is for
  teams that want no Redis, not for throughput; the inbox (one transaction
  that holds the effect and the row) is the SQL mode to use.
- Watermill with its Deduplicator on Redis pays one SET NX per message plus
  its router overhead; its default prefetch of 1 is the usual first surprise.`
