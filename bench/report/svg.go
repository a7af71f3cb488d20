package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// Plain SVG writing for the report's charts: horizontal bar charts (one bar
// per case, whiskers for min–max, reference lines) and line charts (series
// of points). No dependency: the files are text, readable in a browser or
// on GitHub.

// palette is the series colours, colour-blind friendly (Okabe–Ito).
var palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"}

type svgDoc struct {
	b    strings.Builder
	w, h int
}

func newSVG(w, h int) *svgDoc {
	d := &svgDoc{w: w, h: h}
	fmt.Fprintf(&d.b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&d.b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", w, h)
	return d
}

func (d *svgDoc) text(x, y float64, anchor, style, s string) {
	fmt.Fprintf(&d.b, `<text x="%.1f" y="%.1f" text-anchor="%s"%s>%s</text>`+"\n", x, y, anchor, style, html.EscapeString(s))
}

func (d *svgDoc) line(x1, y1, x2, y2 float64, stroke string, width float64, dash string) {
	extra := ""
	if dash != "" {
		extra = fmt.Sprintf(` stroke-dasharray="%s"`, dash)
	}
	fmt.Fprintf(&d.b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f"%s/>`+"\n", x1, y1, x2, y2, stroke, width, extra)
}

func (d *svgDoc) rect(x, y, w, h float64, fill string) {
	fmt.Fprintf(&d.b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", x, y, w, h, fill)
}

func (d *svgDoc) polyline(pts [][2]float64, stroke string) {
	var sb strings.Builder
	for i, p := range pts {
		if i > 0 {
			sb.WriteByte(' ')
		}
		fmt.Fprintf(&sb, "%.1f,%.1f", p[0], p[1])
	}
	fmt.Fprintf(&d.b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", sb.String(), stroke)
}

func (d *svgDoc) String() string { return d.b.String() + "</svg>\n" }

// niceTicks returns about n round tick values covering [0, max].
func niceTicks(max float64, n int) []float64 {
	if max <= 0 {
		return []float64{0, 1}
	}
	raw := max / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for v := 0.0; v <= max+step*0.999; v += step {
		out = append(out, v)
	}
	return out
}

// tickLabel formats an axis value compactly: 12k, 1.5M, 0.25.
func tickLabel(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return trim(v/1e6) + "M"
	case a >= 1e3:
		return trim(v/1e3) + "k"
	default:
		return trim(v)
	}
}

func trim(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

// labelWidth is room for the longest label at 12px (about 7px a
// character), and some margin.
func labelWidth(labels []string) float64 {
	n := 0
	for _, l := range labels {
		n = max(n, len([]rune(l)))
	}
	return math.Max(120, float64(n)*7+20)
}

// bar is one row of a bar chart.
type bar struct {
	label       string
	value       float64
	lo, hi      float64 // whiskers; 0, 0: none
	highlighted bool    // a raw baseline
}

// refLine is a vertical reference line of a bar chart.
type refLine struct {
	label string
	value float64
}

// barChart draws horizontal bars with min–max whiskers and dashed
// reference lines. Highlighted bars (the raw baselines) get a second colour.
func barChart(title, unit, note string, bars []bar, refs []refLine) string {
	const right, top, rowH = 60.0, 58.0, 20.0
	labels := make([]string, len(bars))
	for i, b := range bars {
		labels[i] = b.label
	}
	labelW := labelWidth(labels)
	w := int(labelW + 620 + right)
	bottom := 46.0
	if note != "" {
		bottom += 16
	}
	h := int(top + rowH*float64(len(bars)) + bottom)
	d := newSVG(w, h)
	d.text(12, 22, "start", ` font-size="15" font-weight="bold"`, title)
	d.text(12, 40, "start", ` fill="#444444"`, fmt.Sprintf("%s, median (bar) and min–max of the runs (whisker); dashed: raw baselines", unit))
	max := 0.0
	for _, b := range bars {
		max = math.Max(max, math.Max(b.value, b.hi))
	}
	for _, r := range refs {
		max = math.Max(max, r.value)
	}
	ticks := niceTicks(max*1.05, 6)
	top2 := ticks[len(ticks)-1]
	plotW := float64(w) - labelW - right
	x := func(v float64) float64 { return labelW + v/top2*plotW }
	plotBottom := top + rowH*float64(len(bars))
	for _, t := range ticks {
		d.line(x(t), top-4, x(t), plotBottom, "#e0e0e0", 1, "")
		d.text(x(t), plotBottom+16, "middle", ` fill="#444444"`, tickLabel(t))
	}
	for i, b := range bars {
		y := top + rowH*float64(i)
		fill := palette[0]
		if b.highlighted {
			fill = palette[1]
		}
		d.text(labelW-8, y+rowH/2+4, "end", "", b.label)
		d.rect(x(0), y+3, x(b.value)-x(0), rowH-6, fill)
		if b.hi > 0 {
			cy := y + rowH/2
			d.line(x(b.lo), cy, x(b.hi), cy, "#222222", 1.2, "")
			d.line(x(b.lo), cy-4, x(b.lo), cy+4, "#222222", 1.2, "")
			d.line(x(b.hi), cy-4, x(b.hi), cy+4, "#222222", 1.2, "")
		}
		d.text(x(math.Max(b.value, b.hi))+4, y+rowH/2+4, "start", ` font-size="10" fill="#444444"`, human(b.value))
	}
	for i, r := range refs {
		d.line(x(r.value), top-4, x(r.value), plotBottom, palette[1], 1.2, "5,3")
		d.text(x(r.value), top-8-float64(i%2)*10, "middle", ` font-size="10" fill="`+palette[1]+`"`, r.label)
	}
	d.line(x(0), top-4, x(0), plotBottom, "#444444", 1, "")
	d.text(labelW+plotW/2, plotBottom+34, "middle", "", unit)
	if note != "" {
		d.text(12, float64(h)-10, "start", ` font-size="11" fill="#444444"`, note)
	}
	return d.String()
}

// pairBar is one row of the latency chart: two values drawn side by side.
type pairBar struct {
	label    string
	p50, p99 float64
}

// latencyChart draws p50 and p99 per case on a logarithmic axis (they span
// microseconds to tens of milliseconds).
func latencyChart(title, note string, rows []pairBar) string {
	const right, top, rowH = 80.0, 62.0, 24.0
	labels := make([]string, len(rows))
	for i, r := range rows {
		labels[i] = r.label
	}
	labelW := labelWidth(labels)
	w := int(labelW + 620 + right)
	bottom := 62.0
	h := int(top + rowH*float64(len(rows)) + bottom)
	d := newSVG(w, h)
	d.text(12, 22, "start", ` font-size="15" font-weight="bold"`, title)
	d.text(12, 40, "start", ` fill="#444444"`, "µs per delivery in idemq outside the handler (median of the runs), logarithmic axis")
	lo, hi := math.Inf(1), 0.0
	for _, r := range rows {
		for _, v := range []float64{r.p50, r.p99} {
			if v > 0 {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if hi == 0 {
		lo, hi = 1, 10
	}
	e0, e1 := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if e1 == e0 {
		e1++
	}
	plotW := float64(w) - labelW - right
	x := func(v float64) float64 {
		if v <= 0 {
			return labelW
		}
		return labelW + (math.Log10(v)-e0)/(e1-e0)*plotW
	}
	plotBottom := top + rowH*float64(len(rows))
	for e := e0; e <= e1; e++ {
		v := math.Pow(10, e)
		d.line(x(v), top-4, x(v), plotBottom, "#d0d0d0", 1, "")
		d.text(x(v), plotBottom+16, "middle", ` fill="#444444"`, tickLabel(v))
	}
	for i, r := range rows {
		y := top + rowH*float64(i)
		d.text(labelW-8, y+rowH/2+4, "end", "", r.label)
		d.rect(labelW, y+3, x(r.p50)-labelW, 8, palette[0])
		d.rect(labelW, y+12, x(r.p99)-labelW, 8, palette[1])
		d.text(x(r.p99)+4, y+rowH/2+4, "start", ` font-size="10" fill="#444444"`, human(r.p50)+" / "+human(r.p99))
	}
	d.line(labelW, top-4, labelW, plotBottom, "#444444", 1, "")
	d.rect(labelW, 48, 12, 8, palette[0])
	d.text(labelW+16, 56, "start", ` font-size="11"`, "p50")
	d.rect(labelW+60, 48, 12, 8, palette[1])
	d.text(labelW+76, 56, "start", ` font-size="11"`, "p99")
	d.text(labelW+plotW/2, plotBottom+34, "middle", "", "µs (log scale)")
	if note != "" {
		d.text(12, float64(h)-10, "start", ` font-size="11" fill="#444444"`, note)
	}
	return d.String()
}

// series is one line of a line chart.
type series struct {
	name string
	pts  [][2]float64 // x, y
}

// lineChart draws series on linear axes starting at 0.
func lineChart(title, subtitle, xUnit, yUnit, note string, ss []series) string {
	const left, right, top, w, h = 70.0, 200.0, 56.0, 960, 400
	bottom := 56.0
	if note != "" {
		bottom += 14
	}
	d := newSVG(w, h)
	d.text(12, 22, "start", ` font-size="15" font-weight="bold"`, title)
	d.text(12, 40, "start", ` fill="#444444"`, subtitle)
	xmax, ymax := 0.0, 0.0
	for _, s := range ss {
		for _, p := range s.pts {
			xmax, ymax = math.Max(xmax, p[0]), math.Max(ymax, p[1])
		}
	}
	xt, yt := niceTicks(xmax, 8), niceTicks(ymax*1.05, 6)
	xtop, ytop := xt[len(xt)-1], yt[len(yt)-1]
	plotW, plotH := float64(w)-left-right, float64(h)-top-bottom
	x := func(v float64) float64 { return left + v/xtop*plotW }
	y := func(v float64) float64 { return top + plotH - v/ytop*plotH }
	for _, t := range yt {
		d.line(left, y(t), left+plotW, y(t), "#e0e0e0", 1, "")
		d.text(left-6, y(t)+4, "end", ` fill="#444444"`, tickLabel(t))
	}
	for _, t := range xt {
		d.line(x(t), top, x(t), top+plotH, "#f0f0f0", 1, "")
		d.text(x(t), top+plotH+16, "middle", ` fill="#444444"`, tickLabel(t))
	}
	d.line(left, top+plotH, left+plotW, top+plotH, "#444444", 1, "")
	d.line(left, top, left, top+plotH, "#444444", 1, "")
	for i, s := range ss {
		c := palette[i%len(palette)]
		pts := make([][2]float64, len(s.pts))
		for j, p := range s.pts {
			pts[j] = [2]float64{x(p[0]), y(p[1])}
		}
		d.polyline(pts, c)
		ly := top + 10 + float64(i)*20
		d.line(left+plotW+14, ly, left+plotW+34, ly, c, 3, "")
		d.text(left+plotW+40, ly+4, "start", ` font-size="11"`, s.name)
	}
	d.text(left+plotW/2, top+plotH+36, "middle", "", xUnit)
	fmt.Fprintf(&d.b, `<text x="16" y="%.1f" text-anchor="middle" transform="rotate(-90 16 %.1f)">%s</text>`+"\n", top+plotH/2, top+plotH/2, html.EscapeString(yUnit))
	if note != "" {
		d.text(12, float64(h)-10, "start", ` font-size="11" fill="#444444"`, note)
	}
	return d.String()
}
