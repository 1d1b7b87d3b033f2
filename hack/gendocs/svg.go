package main

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strings"
)

// bar is one horizontal bar; lo and hi draw an interval over it when whisker is set.
type bar struct {
	label         string
	v, lo, hi     float64
	whisker, mark bool
}

type panel struct {
	title string
	bars  []bar
}

const (
	svgWidth   = 680
	labelRight = 150 // labels end here; bars start here
	plotRight  = 560 // bars end here at the axis maximum; value labels after
	rowHeight  = 20
	titleSpace = 26
	panelGap   = 14
)

// axisMax is the value that fills the plot's width. A bar far beyond the others (a policy whose
// queue grows without bound) would flatten every other bar, so it is drawn clipped instead.
func axisMax(bars []bar) (max float64, clipAbove float64) {
	var vs []float64
	for _, b := range bars {
		vs = append(vs, math.Max(b.v, b.hi))
	}
	slices.Sort(vs)
	top := vs[len(vs)-1]
	if len(vs) > 1 && top > 4*vs[len(vs)-2] {
		m := 1.25 * vs[len(vs)-2]
		return m, m
	}
	return top * 1.05, math.Inf(1)
}

// barsSVG draws the panels one under another, each with its own scale.
func barsSVG(title, note string, panels []panel) []byte {
	height := 40
	for _, p := range panels {
		height += titleSpace + rowHeight*len(p.bars) + panelGap
	}
	height += 20
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		svgWidth, height, svgWidth, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", svgWidth, height)
	fmt.Fprintf(&b, `<text x="10" y="22" font-size="14" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	y := 40
	for _, p := range panels {
		fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="bold">%s</text>`+"\n", y+16, html.EscapeString(p.title))
		y += titleSpace
		max, clip := axisMax(p.bars)
		scale := func(v float64) float64 { return labelRight + (plotRight-labelRight)*math.Min(v, max)/max }
		for _, br := range p.bars {
			fill := "#9aa5b1"
			if br.mark {
				fill = "#2f6db5"
			}
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", labelRight-6, y+14, html.EscapeString(br.label))
			w := scale(br.v) - labelRight
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", labelRight, y+3, w, rowHeight-6, fill)
			end := labelRight + w
			if br.whisker {
				lo, hi := scale(br.lo), scale(br.hi)
				mid := y + rowHeight/2
				fmt.Fprintf(&b, `<path d="M%.1f %dH%.1fM%.1f %dV%dM%.1f %dV%d" stroke="#000000" fill="none"/>`+"\n",
					lo, mid, hi, lo, mid-4, mid+4, hi, mid-4, mid+4)
				end = math.Max(end, hi)
			}
			label := fmt.Sprintf("%.2f", br.v)
			if br.v > clip {
				label += " (off scale)"
			}
			fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s</text>`+"\n", end+5, y+14, label)
			y += rowHeight
		}
		y += panelGap
	}
	fmt.Fprintf(&b, `<text x="10" y="%d" font-size="11" fill="#444444">%s</text>`+"\n", y+6, html.EscapeString(note))
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

func fleetPlot(runs []*fleetRun) []byte {
	var panels []panel
	for _, r := range runs {
		if !r.trace.headline {
			continue
		}
		p := panel{title: r.trace.label + " trace"}
		for _, x := range r.results {
			p.bars = append(p.bars, bar{label: x.Policy, v: x.TTFTP90, mark: x.Policy == "kv"})
		}
		panels = append(panels, p)
	}
	return barsSVG("TTFT p90, seconds (fleet model, 8 replicas x 600 blocks)", "make docs: kvbench cache's model (sim/fleet) on the committed traces", panels)
}

func replayPlot(results []*resultFile) []byte {
	var panels []panel
	for _, f := range results {
		p := panel{title: fmt.Sprintf("%s (%s), %d engines", f.Title, f.Label, f.Replay.Replicas)}
		for _, s := range f.Replay.Results {
			p.bars = append(p.bars, bar{label: s.Policy, v: s.TTFTP90.Mean, lo: s.TTFTP90.Lo, hi: s.TTFTP90.Hi,
				whisker: s.TTFTP90.N > 1, mark: s.Policy == "kv"})
		}
		panels = append(panels, p)
	}
	return barsSVG("TTFT p90, seconds (live replay: vllm-sim engines behind kvrouter)", "mean over seeds, bars 95% t-interval; docs/results/*.json", panels)
}
