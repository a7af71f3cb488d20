package main

import (
	"bytes"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseBench(t *testing.T) {
	f, err := os.Open("testdata/bench-small.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	runs, order, err := parse(f)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(order, ","), "Consume/raw-ack-each,Consume/raw-multiple-ack-50,Consume/idemq-noop,Dedup/idemq-dedup-redis,Inbox/idemq-inbox-postgres-batch-50,Publish/raw-confirm-window-256"; got != want {
		t.Fatalf("order %s, want %s", got, want)
	}
	if n := len(runs["Consume/raw-ack-each"]); n != 3 {
		t.Fatalf("%d runs of raw-ack-each, want 3", n)
	}
	if med, lo, hi, _ := stats(runs["Consume/raw-ack-each"], "msgs/s"); med != 14500 || lo != 14300 || hi != 14700 {
		t.Fatalf("raw-ack-each msgs/s median %v min %v max %v, want 14500 14300 14700", med, lo, hi)
	}
	if v, _, _, _ := stats(runs["Dedup/idemq-dedup-redis"], "p99-us"); v != 6200 {
		t.Fatalf("p99-us %v, want 6200", v)
	}
}

func TestParseBenchMalformed(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"value not a number", "BenchmarkConsume/raw-ack-each-2  30000  69000 ns/op  fast msgs/s\n", "line 1: Consume/raw-ack-each: value \"fast\""},
		{"value without unit", "goos: linux\nBenchmarkConsume/raw-ack-each-2  30000  69000 ns/op  14500\n", "line 2: Consume/raw-ack-each: 3 fields"},
		{"count not a number", "BenchmarkConsume/raw-ack-each-2  3e4x  69000 ns/op\n", "line 1: malformed benchmark result"},
		{"failed run", "BenchmarkConsume/raw-ack-each-2  30000  69000 ns/op\n--- FAIL: BenchmarkDedup/idemq-dedup-redis\n", "line 2: the benchmark run failed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := parse(strings.NewReader(c.in))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

func TestParseScaleMalformed(t *testing.T) {
	const head = "scale-run messages=2000 step=20 started=x load=1,1,1\n"
	for _, c := range []struct{ name, in, want string }{
		{"not a scale run", "goos: linux\nPASS\n", "no scale-run line"},
		{"no case", head, "has no case"},
		{"record before the run", "scale-case case=a messages=1\n" + head, "line 1: scale-case before the scale-run line"},
		{"mark of an unknown case", head + "scale-mark case=a msgs=20 t=0.1 cpu=0.1\n", "line 2: case \"a\" has no scale-case line"},
		{"bad number", head + "scale-case case=a messages=2000\nscale-mark case=a msgs=20 t=soon cpu=0.1\n", "line 3: t=\"soon\" is not a number"},
		{"missing field", head + "scale-case case=a messages=2000\nscale-sample case=a t=1 msgs=20\n", "line 3: no rss="},
		{"not key=value", head + "scale-case case=a messages=2000\nscale-done case=a 2000\n", "line 3: field \"2000\" is not key=value"},
		{"case without its count", head + "scale-case case=a\n", "line 2: no messages="},
		{"unknown record", head + "scale-case case=a messages=2000\nscale-oops case=a\n", "line 3: unknown record \"scale-oops\""},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseScale(strings.NewReader(c.in))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

// wellFormed fails unless s parses as XML with an svg root.
func wellFormed(t *testing.T, name, s string) {
	t.Helper()
	dec := xml.NewDecoder(strings.NewReader(s))
	root := ""
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: not well-formed XML: %v", name, err)
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
	if root != "svg" {
		t.Fatalf("%s: root element %q, want svg", name, root)
	}
}

const handWritten = "## Memory per remembered ID\n\nHand-written text & numbers that no run may lose.\n"

func TestRunWritesReportChartsAndScale(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "BENCHMARKS.md")
	old := "# Benchmarks\n\nold tables\n\n" + keptMarker + "\n\n" + handWritten
	if err := os.WriteFile(out, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	o := options{in: "testdata/bench-small.txt", out: out, cmd: "make bench", baseline: "Consume/raw-ack-each", tables: true,
		charts: dir, scale: "testdata/scale-small.txt", scaleCmd: "make bench-scale SCALE_N=2000"}
	var first string
	for i := 0; i < 2; i++ { // a second run replaces the blocks, never adds them again
		if err := run(o, io.Discard); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		md := string(b)
		for _, want := range []string{
			"| consume: raw-ack-each | 3 | 14500 | 14300–14700 | 1.00 |",
			"| consume: idemq-noop | 1 | 30000 |",
			"![Consume: throughput by case](bench-consume.svg)",
			"![Overhead per delivery: p50 and p99](bench-latency.svg)",
			"## Scale run: 2k messages",
			"`make bench-scale SCALE_N=2000`",
			"| redis-dedup-default | 3221 | 137.5 | 4395 |",
			"![scale-throughput](scale-throughput.svg)",
			handWritten,
		} {
			if !strings.Contains(md, want) {
				t.Fatalf("run %d: the report lacks %q:\n%s", i+1, want, md)
			}
		}
		if strings.Contains(md, "old tables") {
			t.Fatal("the tables above the kept marker were not rewritten")
		}
		for _, block := range []string{"charts", "scale"} {
			if n := strings.Count(md, blockBegin(block)); n != 1 {
				t.Fatalf("run %d: %d %s blocks, want 1", i+1, n, block)
			}
		}
		// The charts block is generated (above the marker); the scale
		// block is in the kept part, which make bench leaves alone.
		k := strings.Index(md, keptMarker)
		if strings.Index(md, blockBegin("charts")) > k || strings.Index(md, blockBegin("scale")) < k {
			t.Fatalf("blocks misplaced around the kept marker:\n%s", md)
		}
		if i == 0 {
			first = md[strings.Index(md, keptMarker):]
		} else if got := md[strings.Index(md, keptMarker):]; got != first {
			t.Fatalf("the kept part changed on the second run:\n%s\nwant\n%s", got, first)
		}
	}
	for _, name := range []string{"bench-consume.svg", "bench-publish.svg", "bench-latency.svg", "scale-throughput.svg", "scale-memory.svg", "scale-inbox-rows.svg"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		wellFormed(t, name, string(b))
	}
}

func TestRunWithoutTablesKeepsTheText(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "BENCHMARKS.md")
	old := "# Benchmarks\n\nWritten by `make bench` on an earlier day: tables from that run.\n\n" + keptMarker + "\n\n" + handWritten
	if err := os.WriteFile(out, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	o := options{in: "testdata/bench-small.txt", out: out, baseline: "Consume/raw-ack-each", charts: dir, scale: "testdata/scale-small.txt", scaleCmd: "make bench-scale"}
	if err := run(o, io.Discard); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	if !strings.HasPrefix(md, "# Benchmarks\n\nWritten by `make bench` on an earlier day: tables from that run.\n\n") || !strings.Contains(md, handWritten) {
		t.Fatalf("the text around the blocks changed:\n%s", md)
	}
	if !strings.Contains(md, blockBegin("charts")) || !strings.Contains(md, blockBegin("scale")) {
		t.Fatalf("blocks missing:\n%s", md)
	}
}

func TestRunRejectsMalformedInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.txt")
	if err := os.WriteFile(bad, []byte("BenchmarkConsume/raw-ack-each-2  30000  69000 ns/op  fast msgs/s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "BENCHMARKS.md")
	err := run(options{in: bad, out: out, tables: true}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "bad.txt: line 1") {
		t.Fatalf("error %v, want one naming the file and line", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("a report was written from malformed input (stat: %v)", err)
	}
	empty := filepath.Join(dir, "empty.txt")
	if err := os.WriteFile(empty, []byte("PASS\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(options{in: empty, out: out, tables: true}, io.Discard); err == nil || !strings.Contains(err.Error(), "no benchmark results") {
		t.Fatalf("error %v, want no benchmark results", err)
	}
}

func TestUpsertBlockDamaged(t *testing.T) {
	doc := "# B\n\n" + blockBegin("scale") + "\nhalf a block\n"
	if _, err := upsertBlock(doc, "scale", "x", true); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("error %v, want damaged", err)
	}
	var buf bytes.Buffer
	buf.WriteString("# B\n")
	got, err := upsertBlock(buf.String(), "charts", "body", false)
	if err != nil || !strings.HasSuffix(got, blockBegin("charts")+"\nbody\n"+blockEnd("charts")+"\n") {
		t.Fatalf("no marker: got %q, %v; want the block at the end", got, err)
	}
}

func TestParseScaleTwoProcesses(t *testing.T) {
	b, err := os.ReadFile("testdata/scale-small.txt")
	if err != nil {
		t.Fatal(err)
	}
	second := "# a second process ran one more case apart\nscale-run messages=200 step=2 started=y load=2,2,2\nscale-case case=b messages=200\nscale-mark case=b msgs=200 t=1 cpu=0.5\nscale-done case=b msgs=200 t=1 cpu=0.5\n"
	r, err := parseScale(strings.NewReader(string(b) + second))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.parts) != 2 || r.parts[1].end != nil || r.parts[0].end == nil {
		t.Fatalf("parts %+v, want two, the second without its end", r.parts)
	}
	c := r.caseNamed("b")
	if c == nil || c.part != 1 || c.n != 200 || c.step != 2 {
		t.Fatalf("case b %+v, want part 1, 200 messages, step 2", c)
	}
	if md := renderScale(r, "make bench-scale", nil); !strings.Contains(md, "## Scale run\n") || !strings.Contains(md, "Process 2 (`b`)") {
		t.Fatalf("the section does not tell the processes apart:\n%s", md)
	}
}

// TestTargetsInboxRows: each inbox target row takes its own cases, so a
// faster pipelined batch handler does not stand in for the one-statement
// row, nor a batch handler for the per-delivery row.
func TestTargetsInboxRows(t *testing.T) {
	rate := func(v float64) []sample { return []sample{{"msgs/s": v}} }
	runs := map[string][]sample{
		"Consume/raw-ack-each":                              rate(20000),
		"Inbox/idemq-inbox-postgres-batch-10":               rate(9000),
		"Inbox/idemq-inbox-postgres-batch-50":               rate(10000),
		"Inbox/idemq-inbox-postgres-batchfunc-50":           rate(13000),
		"Inbox/idemq-inbox-postgres-batchfunc-pipelined-50": rate(16000),
	}
	got := targets(runs)
	for _, want := range []string{
		"| batched inbox ≥ 0.7× raw ack-each (best batch size; a statement and a round trip per delivery) | 0.50× (Inbox/idemq-inbox-postgres-batch-50) | no |",
		"| batched inbox, a statement per delivery in one pipeline (BatchFunc + pgx.Batch) ≥ 0.7× raw ack-each | 0.80× (Inbox/idemq-inbox-postgres-batchfunc-pipelined-50) | yes |",
		"| batched inbox, one effect statement per batch (BatchFunc) ≥ 0.7× raw ack-each | 0.65× (Inbox/idemq-inbox-postgres-batchfunc-50) | no |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("targets lack %q:\n%s", want, got)
		}
	}
}

// TestRenderRoundTripSection: the PostgreSQL round-trip cases get their
// own table, rated in statements per second against exec-each, with the
// CPU per statement as extras (not in "Other", not rated in msgs/s).
func TestRenderRoundTripSection(t *testing.T) {
	runs := map[string][]sample{
		"PostgresRoundTrip/exec-each": {{"stmts/s": 12000, "client-cpu-us/stmt": 40, "pg-cpu-us/stmt": 31}},
		"PostgresRoundTrip/pipelined": {{"stmts/s": 90000, "client-cpu-us/stmt": 5.5, "pg-cpu-us/stmt": 6.5}},
	}
	md := render(runs, []string{"PostgresRoundTrip/exec-each", "PostgresRoundTrip/pipelined"}, "Consume/raw-ack-each", "make bench")
	for _, want := range []string{
		"## PostgreSQL round trips",
		"| case | runs | stmts/s (median) | min–max | × exec-each |",
		"| postgresroundtrip: pipelined | 1 | 90000 | 90000–90000 | 7.50 | — | — | — | 5.5 client-cpu-us/stmt, 6.5 pg-cpu-us/stmt |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "## Other") {
		t.Errorf("round-trip cases fell into Other:\n%s", md)
	}
}
