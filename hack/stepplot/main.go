// Command stepplot draws one of vllm-sim's calibrated step-time models against the measured
// points it was fitted to as an SVG, using only the standard library:
//
//	go run ./hack/stepplot -model splitwise-h100 > sim/vllmsim/step-time.svg
//	go run ./hack/stepplot -model vllm-0.20.1-b300 > sim/vllmsim/step-time-vllm-0.20.1-b300.svg
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"strings"

	"github.com/kvroute/kvroute/sim/vllmsim"
)

type point struct {
	Phase  string  `json:"phase"`
	Batch  int     `json:"batch_size"`
	Prompt int     `json:"prompt_size"`
	Ms     float64 `json:"ms"`
}

// panel maps data coordinates onto a rectangle of the canvas (log-log axes).
type panel struct {
	x, y, w, h             float64
	xmin, xmax, ymin, ymax float64
	title, xlabel          string
}

func (p panel) px(v float64) float64 {
	return p.x + p.w*(math.Log10(v)-math.Log10(p.xmin))/(math.Log10(p.xmax)-math.Log10(p.xmin))
}

func (p panel) py(v float64) float64 {
	return p.y + p.h - p.h*(math.Log10(v)-math.Log10(p.ymin))/(math.Log10(p.ymax)-math.Log10(p.ymin))
}

func (p panel) frame(b *strings.Builder) {
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#444"/>`+"\n", p.x, p.y, p.w, p.h)
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="14" text-anchor="middle">%s</text>`+"\n", p.x+p.w/2, p.y-10, p.title)
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle">%s</text>`+"\n", p.x+p.w/2, p.y+p.h+36, p.xlabel)
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle" transform="rotate(-90 %.1f %.1f)">step time (ms)</text>`+"\n",
		p.x-46, p.y+p.h/2, p.x-46, p.y+p.h/2)
	for v := p.xmin; v <= p.xmax*1.0001; v *= 2 {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.1f" y="%.1f" font-size="10" text-anchor="middle">%g</text>`+"\n",
			p.px(v), p.y, p.px(v), p.y+p.h, p.px(v), p.y+p.h+16, v)
	}
	for _, v := range []float64{10, 20, 50, 100, 200, 500, 1000, 2000, 5000} {
		if v < p.ymin || v > p.ymax {
			continue
		}
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.1f" y="%.1f" font-size="10" text-anchor="end">%g</text>`+"\n",
			p.x, p.py(v), p.x+p.w, p.py(v), p.x-4, p.py(v)+3, v)
	}
}

func (p panel) line(b *strings.Builder, color string, f func(x float64) float64) {
	var pts []string
	for i := 0; i <= 200; i++ {
		x := p.xmin * math.Pow(p.xmax/p.xmin, float64(i)/200)
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", p.px(x), p.py(f(x))))
	}
	fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, strings.Join(pts, " "))
}

func (p panel) dot(b *strings.Builder, color string, x, y float64) {
	fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="4" fill="none" stroke="%s" stroke-width="2"/>`+"\n", p.px(x), p.py(y), color)
}

func legend(b *strings.Builder, x, y float64, color, text string, dot bool) {
	if dot {
		fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="4" fill="none" stroke="%s" stroke-width="2"/>`, x+10, y-4, color)
	} else {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/>`, x, y-4, x+20, y-4, color)
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="11">%s</text>`+"\n", x+26, y, text)
}

func main() {
	model := flag.String("model", vllmsim.DefaultStepModel, "step model to draw: vllm-0.20.1-b300 or splitwise-h100 (alias calibrated)")
	flag.Parse()
	switch vllmsim.CanonicalStepModel(*model) {
	case vllmsim.StepModelSplitwiseH100:
		splitwise()
	case vllmsim.StepModelVLLM0201B300:
		b300()
	default:
		fmt.Fprintln(os.Stderr, "unknown model", *model)
		os.Exit(2)
	}
}

// stepPoint is one point of a per-step calibration file: prefill chunks [computed, new], decodes
// and their total context, and the measured time.
type stepPoint struct {
	Prefill   [][2]int `json:"prefill"`
	Decodes   int      `json:"decodes"`
	DecodeCtx int      `json:"decode_context"`
	Ms        float64  `json:"ms"`
}

// b300 draws the vllm-0.20.1-b300 model and the vLLM 0.20.1 forward-pass records it was fitted to.
func b300() {
	const model = "vllm-0.20.1-b300"
	raw, err := os.ReadFile("testdata/vllmsim/step-time-vllm-0.20.1-b300.json")
	if err != nil {
		fmt.Fprintln(os.Stderr, "run from the repository root:", err)
		os.Exit(1)
	}
	var doc struct{ Points []stepPoint }
	if err := json.Unmarshal(raw, &doc); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ms := func(p, d, ctx int) float64 {
		v, _ := vllmsim.StepModelMs(model, p, d, ctx)
		return v
	}
	var b strings.Builder
	b.WriteString(`<svg xmlns="http://www.w3.org/2000/svg" width="960" height="420" font-family="sans-serif">` + "\n")
	b.WriteString(`<rect width="960" height="420" fill="white"/>` + "\n")
	left := panel{x: 70, y: 40, w: 380, h: 300, xmin: 32, xmax: 16384, ymin: 10, ymax: 1000,
		title: "Prefill in the step (one fresh prompt)", xlabel: "prefill tokens in the step"}
	// Decode steps against their total context: the source's decode records span 1 to 32
	// sequences over 4k to 127k tokens, and this model has no per-sequence term (it fits to 0),
	// so below the knee a decode step's time depends on the context alone and every record has
	// a place on one line; drawn against the batch size, most would sit between lines.
	right := panel{x: 550, y: 40, w: 380, h: 300, xmin: 2048, xmax: 262144, ymin: 10, ymax: 50,
		title: "Decode-only step", xlabel: "total decode context (tokens)"}
	left.frame(&b)
	right.frame(&b)
	colors := []string{"#1f77b4", "#ff7f0e", "#2ca02c"}
	for i, d := range []int{0, 13, 31} {
		left.line(&b, colors[i], func(x float64) float64 { return ms(int(x), d, 3600) })
		legend(&b, 80, float64(60+16*i), colors[i], fmt.Sprintf("model, + %d decodes of 3600 ctx", d), false)
	}
	for i, d := range []int{1, 32} {
		right.line(&b, colors[i], func(x float64) float64 { return ms(0, d, int(x)/d) })
	}
	legend(&b, 560, 60, colors[0], "model, 1 or 32 decodes (one line)", false)
	decodeColor := func(d int) string {
		switch {
		case d <= 8:
			return "#d62728"
		case d < 32:
			return "#9467bd"
		}
		return "#8c564b"
	}
	for _, p := range doc.Points {
		prefill := 0
		for _, c := range p.Prefill {
			prefill += c[1]
		}
		switch {
		case prefill > 0 && p.Decodes == 0:
			left.dot(&b, "#d62728", float64(prefill), p.Ms)
		case prefill > 0:
			left.dot(&b, "#9467bd", float64(prefill), p.Ms)
		default:
			right.dot(&b, decodeColor(p.Decodes), float64(p.DecodeCtx), p.Ms)
		}
	}
	legend(&b, 80, 124, "#d62728", "vLLM 0.20.1 B300 Qwen3-32B: prefill-only step", true)
	legend(&b, 80, 140, "#9467bd", "vLLM 0.20.1: prefill with 1 to 31 decodes", true)
	legend(&b, 560, 76, "#d62728", "vLLM 0.20.1: 1 to 8 decodes", true)
	legend(&b, 560, 92, "#9467bd", "vLLM 0.20.1: 13 to 22 decodes", true)
	legend(&b, 560, 108, "#8c564b", "vLLM 0.20.1: 32 decodes", true)
	b.WriteString(`<text x="480" y="405" font-size="11" text-anchor="middle">vllm-sim --step-model vllm-0.20.1-b300 (sim/vllmsim/stepmodel.go) and the points of testdata/vllmsim/step-time-vllm-0.20.1-b300.json; log-log axes, before --time-scale</text>` + "\n")
	b.WriteString("</svg>\n")
	fmt.Print(b.String())
}

// splitwise draws the splitwise-h100 model and the Splitwise points it was fitted to.
func splitwise() {
	stepMs := func(prefill, decodes, ctx int) float64 {
		ms, _ := vllmsim.StepModelMs(vllmsim.StepModelSplitwiseH100, prefill, decodes, ctx)
		return ms
	}
	raw, err := os.ReadFile("testdata/vllmsim/step-time.json")
	if err != nil {
		fmt.Fprintln(os.Stderr, "run from the repository root:", err)
		os.Exit(1)
	}
	var doc struct{ Points []point }
	if err := json.Unmarshal(raw, &doc); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var b strings.Builder
	b.WriteString(`<svg xmlns="http://www.w3.org/2000/svg" width="960" height="420" font-family="sans-serif">` + "\n")
	b.WriteString(`<rect width="960" height="420" fill="white"/>` + "\n")
	left := panel{x: 70, y: 40, w: 380, h: 300, xmin: 64, xmax: 16384, ymin: 20, ymax: 5000,
		title: "Prefill in the step (one fresh prompt)", xlabel: "prefill tokens in the step"}
	right := panel{x: 550, y: 40, w: 380, h: 300, xmin: 1, xmax: 256, ymin: 20, ymax: 500,
		title: "Decode-only step", xlabel: "decoding sequences"}
	left.frame(&b)
	right.frame(&b)
	colors := []string{"#1f77b4", "#ff7f0e", "#2ca02c"}
	for i, d := range []int{0, 64, 256} {
		left.line(&b, colors[i], func(x float64) float64 { return stepMs(int(x), d, 2048) })
		legend(&b, 80, float64(60+16*i), colors[i], fmt.Sprintf("model, + %d decodes of 2048 ctx", d), false)
	}
	for i, ctx := range []int{576, 8192} {
		right.line(&b, colors[i], func(x float64) float64 { return stepMs(0, int(x), ctx) })
		legend(&b, 560, float64(60+16*i), colors[i], fmt.Sprintf("model, context %d per sequence", ctx), false)
	}
	for _, p := range doc.Points {
		switch {
		case p.Phase == "prefill" && p.Batch == 1:
			left.dot(&b, "#d62728", float64(p.Prompt), p.Ms)
		case p.Phase == "prefill": // b prompts of 512: drawn at their total, model for b prompts differs slightly
			left.dot(&b, "#9467bd", float64(p.Batch*p.Prompt), p.Ms)
		case p.Phase == "decode" && p.Prompt == 512:
			right.dot(&b, "#d62728", float64(p.Batch), p.Ms)
		}
	}
	legend(&b, 80, 108, "#d62728", "Splitwise H100 Llama2-70B: 1 prompt", true)
	legend(&b, 80, 124, "#9467bd", "Splitwise: batch of 512-token prompts", true)
	legend(&b, 560, 92, "#d62728", "Splitwise: decode, prompt 512", true)
	b.WriteString(`<text x="480" y="405" font-size="11" text-anchor="middle">vllm-sim --step-model splitwise-h100 (sim/vllmsim/stepmodel.go) and the points of testdata/vllmsim/step-time.json; log-log axes, before --time-scale</text>` + "\n")
	b.WriteString("</svg>\n")
	fmt.Print(b.String())
}
