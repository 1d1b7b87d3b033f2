package assess

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// RenderJSON writes the assessment as indented JSON (the shape of Assessment's tags).
func RenderJSON(w io.Writer, a Assessment) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(a)
}

// RenderTable writes the assessment for a terminal: the per-replica table, then the verdict and
// its reasons, wrapped at 100 columns.
func RenderTable(w io.Writer, a Assessment) error {
	b := &strings.Builder{}
	fmt.Fprintf(b, "%s\n\n", title(a))
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	hdr := columns()
	fmt.Fprintln(tw, strings.Join(hdr, "\t"))
	for _, row := range rows(a) {
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	_ = tw.Flush()
	fmt.Fprintf(b, "load spread (%s): CV %.2f, max/mean %.2f\n\n", a.Fleet.LoadBasis, a.Fleet.LoadCV, a.Fleet.LoadMaxOverMean)
	fmt.Fprintf(b, "VERDICT: %s\n", a.Verdict)
	b.WriteString(wrap(a.Headline, 100, "") + "\n")
	section(b, "Why", a.Reasons)
	section(b, "Estimate", estimateLines(a))
	section(b, "Assumptions", a.Estimate.Assumptions)
	section(b, "Warnings", a.Warnings)
	section(b, "About the counters", a.Counters)
	section(b, "Collection", a.Notes)
	_, err := io.WriteString(w, b.String())
	return err
}

// RenderMarkdown writes the assessment as a Markdown report (for an issue or a wiki page).
func RenderMarkdown(w io.Writer, a Assessment) error {
	b := &strings.Builder{}
	fmt.Fprintf(b, "## %s\n\n", title(a))
	fmt.Fprintf(b, "**Verdict: `%s`** — %s\n\n", a.Verdict, a.Headline)
	hdr := columns()
	b.WriteString("| " + strings.Join(hdr, " | ") + " |\n")
	b.WriteString("|" + strings.Repeat("---|", len(hdr)) + "\n")
	for _, row := range rows(a) {
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	fmt.Fprintf(b, "\nLoad spread (%s): CV %.2f, max/mean %.2f.\n", a.Fleet.LoadBasis, a.Fleet.LoadCV, a.Fleet.LoadMaxOverMean)
	for _, s := range []struct {
		name  string
		lines []string
	}{{"Why", a.Reasons}, {"Estimate", estimateLines(a)}, {"Assumptions", a.Estimate.Assumptions},
		{"Warnings", a.Warnings}, {"About the counters", a.Counters}, {"Collection", a.Notes}} {
		if len(s.lines) == 0 {
			continue
		}
		fmt.Fprintf(b, "\n### %s\n\n", s.name)
		for _, l := range s.lines {
			b.WriteString("- " + l + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func title(a Assessment) string {
	model := a.Model
	if model == "" {
		model = "(unnamed)"
	}
	return fmt.Sprintf("kvroutectl assess: model %s, %d replicas, window %s, from %s", model, a.Fleet.Replicas,
		secs(a.WindowSeconds), a.Source)
}

func columns() []string {
	return []string{"REPLICA", "HIT RATE", "PROMPT TOK/S", "REQ/S", "PREEMPTIONS", "PREEMPT/REQ", "KV MEAN", "KV MAX", "IN FLIGHT"}
}

func rows(a Assessment) [][]string {
	var out [][]string
	for _, r := range a.Replicas {
		out = append(out, []string{r.ID, optPct(r.HitRate), num(r.QueryTokensPerS), optNum(r.RequestsPerS),
			optNum(r.Preemptions), optRatio(r.PreemptionsPerRequest), optPct(r.KVUsageMean), optPct(r.KVUsageMax),
			optNum(r.InFlightMean)})
	}
	f := a.Fleet
	return append(out, []string{"fleet", pct(f.HitRate), num(f.QueryTokensPerS), optNum(f.RequestsPerS),
		optNum(f.Preemptions), optRatio(f.PreemptionsPerRequest), optPct(f.KVUsageMean), optPct(f.KVUsageMax), optNum(f.InFlightMean)})
}

func estimateLines(a Assessment) []string {
	e := a.Estimate
	if a.Verdict == VerdictSingleReplica {
		return []string{"Nothing to estimate with one replica."}
	}
	lines := []string{
		fmt.Sprintf("Blind placement today: %s of prompt tokens hit; %s prompt tokens/s are prefilled.",
			pct(e.BlindHitRate), num(a.Fleet.MissTokensPerS)),
		fmt.Sprintf("One shared cache, favourable reading: up to %s (%s), with %s of prompt tokens in prefixes "+
			"looked up about %s times each across the fleet.", pct(e.HitRate), pts(e.GainMax), pct(e.ReusedShare), recurRange(e.Ceiling)),
	}
	saved := fmt.Sprintf("Prefill saved by routing: at most %s of prompt tokens (%s tokens/s)", pts(e.GainMax),
		num(e.PrefillTokensPerSSavedMax))
	if a.Verdict == VerdictWorthRouting {
		// As a share of today's prefill only where the favourable reading is plausible: with high
		// hit rates everywhere it tends to (N-1)/N of a small remainder, which reads as a promise.
		saved += fmt.Sprintf(", i.e. up to %s of the prefill computed today", pct(e.PrefillSavedMax))
	}
	return append(lines, saved+"; nothing if the reuse is a few prefixes hot on every replica.")
}

func section(b *strings.Builder, name string, lines []string) {
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(b, "\n%s:\n", name)
	for _, l := range lines {
		b.WriteString(wrap(l, 100, "  - ") + "\n")
	}
}

// wrap breaks text at spaces so no line exceeds width; the first line starts with lead, the
// others with as many spaces.
func wrap(text string, width int, lead string) string {
	indent := strings.Repeat(" ", len(lead))
	var b strings.Builder
	line := lead
	empty := true
	for _, word := range strings.Fields(text) {
		if !empty && len(line)+1+len(word) > width {
			b.WriteString(line + "\n")
			line, empty = indent, true
		}
		if !empty {
			line += " "
		}
		line += word
		empty = false
	}
	b.WriteString(line)
	return b.String()
}

func pct(x float64) string { return strconv.FormatFloat(100*x, 'f', 1, 64) + "%" }

// pts is a difference of two shares, in percentage points.
func pts(x float64) string { return "+" + strconv.FormatFloat(100*x, 'f', 1, 64) + " points" }

func ratio(x float64) string { return strconv.FormatFloat(x, 'f', 3, 64) }

// num prints counts and rates: thousands separated above 100, one decimal below.
func num(x float64) string {
	if math.Abs(x) < 100 {
		s := strconv.FormatFloat(x, 'f', 1, 64)
		return strings.TrimSuffix(s, ".0")
	}
	s := strconv.FormatFloat(math.Round(x), 'f', 0, 64)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

func secs(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(100 * time.Millisecond).String()
}

func optPct(p *float64) string {
	if p == nil {
		return "-"
	}
	return pct(*p)
}

func optNum(p *float64) string {
	if p == nil {
		return "-"
	}
	return num(*p)
}

func optRatio(p *float64) string {
	if p == nil {
		return "-"
	}
	return ratio(*p)
}
