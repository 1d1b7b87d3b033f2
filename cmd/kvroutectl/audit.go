package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/kvroute/kvroute/router/audit"
	"github.com/kvroute/kvroute/sim/fleet"
)

// auditOutput is `kvroutectl audit --output json`.
type auditOutput struct {
	Trace    *audit.LeadStats `json:"trace,omitempty"`
	Bodies   bodyCounts       `json:"bodies"`
	Patterns []audit.Pattern  `json:"patterns"`
}

type bodyCounts struct {
	Read       int `json:"read"`
	Text       int `json:"text"`
	TokenIDs   int `json:"token_ids"`
	Unreadable int `json:"unreadable"`
}

// runAudit is the prompt audit offline: a captured trace says how often prompts start with a
// block never seen before; request bodies say where and what varies.
func runAudit(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bodies := fs.String("bodies", "", "JSONL of OpenAI request bodies (completion or chat), one a line")
	trace := fs.String("trace", "", "a captured trace (file or kvrouter capture directory) for the first-block figures")
	blockChars := fs.Int("block-chars", 64, "unchained block size in characters (about 16 tokens)")
	minVariants := fs.Int("min-variants", 3, "distinct leads before a repeated block that make a pattern")
	showText := fs.Bool("show-text", false, "show the varying spans' text (default: their shape only)")
	output := fs.String("output", "table", "table or json")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: kvroutectl audit [--bodies requests.jsonl] [--trace captured.jsonl|DIR] [--show-text] [--output table|json]")
		fmt.Fprintln(stderr, "\nFinds prompts whose start varies (a timestamp, an id) while what follows repeats: the prefix cache")
		fmt.Fprintln(stderr, "cannot match them past the varying span, whatever the router does. See docs/should-you-route.md.")
		fmt.Fprintln(stderr, "Give --bodies, --trace or both: the trace says how often prompts start with a block never seen")
		fmt.Fprintln(stderr, "before; the request bodies say where and what varies.\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 || (*bodies == "" && *trace == "") || (*output != "table" && *output != "json") || *blockChars < 1 {
		fs.Usage()
		return 2
	}
	var out auditOutput
	if *trace != "" {
		tr, err := fleet.LoadTrace(*trace)
		if err != nil {
			fmt.Fprintln(stderr, "kvroutectl audit:", err)
			return 1
		}
		ids := make([][]uint64, len(tr.Requests))
		for i, q := range tr.Requests {
			ids[i] = q.HashIDs
		}
		st := audit.FirstBlockStats(ids)
		out.Trace = &st
	}
	if *bodies != "" {
		a := audit.New(audit.Options{SampleEvery: 1, BlockUnits: *blockChars, MinVariants: *minVariants,
			MaxAnchors: 1 << 16, ShowText: *showText, Decode: audit.Runes,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err := readBodies(*bodies, a, &out.Bodies); err != nil {
			fmt.Fprintln(stderr, "kvroutectl audit:", err)
			return 1
		}
		a.Close()
		out.Patterns = a.Patterns()
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
		return 0
	}
	writeAudit(stdout, &out, *blockChars)
	return 0
}

func readBodies(path string, a *audit.Auditor, c *bodyCounts) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		if len(sc.Bytes()) == 0 {
			continue
		}
		c.Read++
		units, text, err := audit.BodyUnits(sc.Bytes())
		switch {
		case err != nil:
			c.Unreadable++
			continue
		case text:
			c.Text++
		default:
			// Token ids: the finder still localises the span; its shape needs the engine.
			c.TokenIDs++
		}
		a.Add(units)
	}
	return sc.Err()
}

func writeAudit(w io.Writer, out *auditOutput, blockChars int) {
	if t := out.Trace; t != nil {
		fmt.Fprintf(w, "trace: %d requests; %.0f%% start with a 512-token block no earlier request had\n", t.Requests, 100*t.NewFirstBlock)
	}
	if out.Bodies.Read > 0 {
		fmt.Fprintf(w, "bodies: %d read (%d text, %d token ids, %d unreadable)\n", out.Bodies.Read, out.Bodies.Text, out.Bodies.TokenIDs, out.Bodies.Unreadable)
		if len(out.Patterns) == 0 {
			fmt.Fprintln(w, "no varying prompt start found")
		}
	}
	for _, p := range out.Patterns {
		fmt.Fprintf(w, "pattern %d: %s at character %d (%d characters, in %d-character block %d), %d variants in %d prompts; the text after it repeats from character %d\n",
			p.ID, p.Shape, p.SpanStart, p.SpanUnits, blockChars, p.Block, p.Variants, p.Prompts, p.RepeatsFrom)
		for _, e := range p.Examples {
			fmt.Fprintf(w, "    %q\n", e)
		}
	}
	if len(out.Patterns) > 0 {
		fmt.Fprintln(w, "fix: move the varying field after the shared text (end of the system prompt, or the user turn); no router can match past it")
	}
}
