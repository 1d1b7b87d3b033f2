package main

import (
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// The report is one self-contained HTML file with inline SVG drawn here: no scripts, no network.
// Plotting is hand-written because the few charts needed do not justify a plotting dependency.

const plotW, plotH, padL, padB, padT, padR = 640.0, 300.0, 60.0, 40.0, 30.0, 150.0

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

type series struct {
	name string
	xs   []float64
	ys   []float64
}

func writeReport(dir string, out *cacheOutput, cmdline string) error {
	if err := mkdir(dir); err != nil {
		return err
	}
	var b strings.Builder
	esc := html.EscapeString
	fmt.Fprintf(&b, "<!doctype html><html><head><meta charset=\"utf-8\"><title>kvbench cache: %s</title>"+
		"<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"+
		"code{background:#f4f4f4;padding:2px}</style></head><body>", esc(out.Trace))
	fmt.Fprintf(&b, "<h1>kvbench cache — %s</h1><p>%d replicas, %d blocks of 512 tokens (%d per replica).</p>",
		esc(out.Trace), out.Replicas, out.CapacityBlocks, out.CapacityBlocks/out.Replicas)
	fmt.Fprintf(&b, "<p>Command: <code>%s</code></p>", esc(cmdline))
	b.WriteString("<h2>Results</h2>")
	var tb strings.Builder
	_ = writeTable(&tb, out)
	b.WriteString("<pre>" + esc(tb.String()) + "</pre>")

	b.WriteString("<h2>Hit rate per policy vs the reference lines</h2>")
	b.WriteString(hitBars(out))

	var cdf []series
	for _, r := range out.Results {
		s := series{name: r.Policy}
		n := len(r.TTFTs)
		step := max(n/400, 1)
		for i := 0; i < n; i += step {
			s.xs = append(s.xs, r.TTFTs[i])
			s.ys = append(s.ys, float64(i+1)/float64(n))
		}
		cdf = append(cdf, s)
	}
	b.WriteString("<h2>Modelled TTFT CDF</h2>")
	b.WriteString(linePlot(cdf, "TTFT (s, log scale)", "share of requests", true))

	var ratio []series
	for _, r := range out.Results {
		s := series{name: r.Policy}
		for i, v := range r.WindowRatio {
			s.xs = append(s.xs, float64(i))
			s.ys = append(s.ys, v)
		}
		ratio = append(ratio, s)
	}
	b.WriteString("<h2>Imbalance over 60 s windows (max / mean uncached prefill tokens)</h2>")
	b.WriteString(linePlot(ratio, "window", "max / mean", false))

	for _, r := range out.Results {
		var per []series
		for rep := 0; rep < out.Replicas && rep < 16; rep++ {
			s := series{name: fmt.Sprintf("r%d", rep)}
			for w, load := range r.WindowLoad {
				s.xs = append(s.xs, float64(w))
				v := 0.0
				if load != nil {
					v = load[rep]
				}
				s.ys = append(s.ys, v)
			}
			per = append(per, s)
		}
		fmt.Fprintf(&b, "<h2>Prefill load per replica over time: %s</h2>", esc(r.Policy))
		if out.Replicas > 16 {
			b.WriteString("<p>First 16 replicas shown.</p>")
		}
		b.WriteString(linePlot(per, "60 s window", "uncached prefill tokens", false))
	}
	b.WriteString("</body></html>\n")
	return os.WriteFile(filepath.Join(dir, "index.html"), []byte(b.String()), 0o644)
}

func svgOpen(b *strings.Builder) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-size="11">`, plotW+padL+padR, plotH+padT+padB)
}

func hitBars(out *cacheOutput) string {
	var b strings.Builder
	svgOpen(&b)
	top := math.Max(out.Ceilings.Belady, 0.01)
	for _, r := range out.Results {
		top = math.Max(top, r.HitRateBlocks)
	}
	top *= 1.1
	y := func(v float64) float64 { return padT + plotH - v/top*plotH }
	n := float64(len(out.Results))
	bw := plotW / math.Max(n, 1)
	for i, r := range out.Results {
		x := padL + float64(i)*bw
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, x+bw*0.15, y(r.HitRateBlocks), bw*0.7, padT+plotH-y(r.HitRateBlocks), palette[i%len(palette)])
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%.3f</text>`, x+bw/2, y(r.HitRateBlocks)-3, r.HitRateBlocks)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, x+bw/2, padT+plotH+15, html.EscapeString(r.Policy))
	}
	for _, ref := range []struct {
		name string
		v    float64
		c    string
	}{{"global-lru", out.Ceilings.GlobalLRU, "#000"}, {"belady", out.Ceilings.Belady, "#888"}} {
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="6,3"/>`, padL, padL+plotW, y(ref.v), y(ref.v), ref.c)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f">%s %.3f</text>`, padL+plotW+5, y(ref.v)+4, ref.name, ref.v)
	}
	axes(&b, 0, top, "", "hit_rate_blocks")
	b.WriteString("</svg>")
	return b.String()
}

func axes(b *strings.Builder, ylo, yhi float64, xlabel, ylabel string) {
	fmt.Fprintf(b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#000"/>`, padL, padT, padL, padT+plotH)
	fmt.Fprintf(b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#000"/>`, padL, padT+plotH, padL+plotW, padT+plotH)
	for k := 0; k <= 4; k++ {
		v := ylo + (yhi-ylo)*float64(k)/4
		yy := padT + plotH - float64(k)/4*plotH
		fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`, padL-4, yy+4, short(v))
	}
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" text-anchor="middle">%s</text>`, padL+plotW/2, padT+plotH+32, html.EscapeString(xlabel))
	fmt.Fprintf(b, `<text x="12" y="%.0f" transform="rotate(-90 12 %.0f)" text-anchor="middle">%s</text>`, padT+plotH/2, padT+plotH/2, html.EscapeString(ylabel))
}

func short(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case a >= 1e3:
		return fmt.Sprintf("%.0fk", v/1e3)
	case a >= 10:
		return fmt.Sprintf("%.0f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func linePlot(ss []series, xlabel, ylabel string, logX bool) string {
	var b strings.Builder
	svgOpen(&b)
	xlo, xhi, yhi := math.Inf(1), math.Inf(-1), 0.0
	tx := func(x float64) float64 {
		if logX {
			return math.Log10(math.Max(x, 1e-3))
		}
		return x
	}
	for _, s := range ss {
		for i := range s.xs {
			xlo, xhi = math.Min(xlo, tx(s.xs[i])), math.Max(xhi, tx(s.xs[i]))
			yhi = math.Max(yhi, s.ys[i])
		}
	}
	if math.IsInf(xlo, 1) {
		xlo, xhi = 0, 1
	}
	if xhi == xlo {
		xhi = xlo + 1
	}
	if yhi == 0 {
		yhi = 1
	}
	for k, s := range ss {
		var pts []string
		for i := range s.xs {
			px := padL + (tx(s.xs[i])-xlo)/(xhi-xlo)*plotW
			py := padT + plotH - s.ys[i]/yhi*plotH
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px, py))
		}
		c := palette[k%len(palette)]
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`, c, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" fill="%s">%s</text>`, padL+plotW+8, padT+12+float64(k)*14, c, html.EscapeString(s.name))
	}
	lo, hi := xlo, xhi
	if logX {
		lo, hi = math.Pow(10, xlo), math.Pow(10, xhi)
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">%s</text><text x="%.0f" y="%.0f" text-anchor="end">%s</text>`,
		padL, padT+plotH+15, short(lo), padL+plotW, padT+plotH+15, short(hi))
	axes(&b, 0, yhi, xlabel, ylabel)
	b.WriteString("</svg>")
	return b.String()
}
