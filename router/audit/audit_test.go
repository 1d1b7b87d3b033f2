package audit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/sim/vllmsim"
)

const system = "You are the support assistant of an online bookshop. Answer politely and briefly, cite the order " +
	"number when there is one, never invent a delivery date, and hand over to a human when the customer asks. "

func stampedPrompts(n int) []string {
	t0 := time.Date(2026, 12, 3, 17, 15, 2, 0, time.UTC)
	var out []string
	for i := 0; i < n; i++ {
		at := t0.Add(time.Duration(i*37) * time.Second)
		out = append(out, "Current time: "+at.Format("2006-01-02 15:04:05")+" UTC. "+strings.Repeat(system, 3)+
			fmt.Sprintf("Question %d: where is my parcel?", i))
	}
	return out
}

func simDecode(_ context.Context, ids []uint32) (string, error) { return vllmsim.Detokenize(ids) }

func waitPatterns(t *testing.T, a *Auditor, n int) []Pattern {
	t.Helper()
	a.Close() // shapes what is queued
	ps := a.Patterns()
	if len(ps) != n {
		t.Fatalf("%d patterns, want %d: %+v", len(ps), n, ps)
	}
	return ps
}

// A system prompt stamped with the time at its start: the audit names the span a timestamp, in
// block 0, and by default shows no text.
func TestAuditNamesAStampedSystemPrompt(t *testing.T) {
	for _, show := range []bool{false, true} {
		a := New(Options{SampleEvery: 1, Decode: simDecode, ShowText: show})
		for _, p := range stampedPrompts(12) {
			a.Observe(vllmsim.Tokenize(p))
		}
		p := waitPatterns(t, a, 1)[0]
		if p.Shape != "<timestamp>" || p.Block != 0 || p.SpanStart < 5 || p.SpanStart > 16 || p.Variants < 3 || p.DecodeError != "" {
			t.Fatalf("pattern %+v, want a <timestamp> in block 0 after \"Current time: \"", p)
		}
		if !show && len(p.Examples) != 0 {
			t.Fatalf("text shown without ShowText: %v", p.Examples)
		}
		if show && (len(p.Examples) < 3 || !strings.HasPrefix(p.Examples[0], "2026-12-03 17:")) {
			t.Fatalf("examples %q", p.Examples)
		}
	}
}

// Prompts that share their start, or share nothing, are no pattern.
func TestAuditQuietOnSharedOrUnrelatedPrompts(t *testing.T) {
	a := New(Options{SampleEvery: 1, Decode: simDecode})
	for i := 0; i < 20; i++ {
		a.Observe(vllmsim.Tokenize(strings.Repeat(system, 2) + fmt.Sprintf("Question %d", i)))
		a.Observe(vllmsim.Tokenize(fmt.Sprintf("%d unrelated %s", i*7919, strings.Repeat(fmt.Sprint(i), 80))))
	}
	waitPatterns(t, a, 0)
}

// Offline, characters are the units and decoding is the identity: a request id is <hex:N> or
// <uuid>, an epoch <digits:10>.
func TestAuditOnCharacters(t *testing.T) {
	for _, tc := range []struct {
		stamp func(i int) string
		want  string
	}{
		{func(i int) string { return fmt.Sprintf("epoch=%d ", 1764781502+i*3) }, "<digits:10>"},
		{func(i int) string { return fmt.Sprintf("req %08x-1b2c-4d5e-8f90-%012x ", 0xdeadbeef+i*977, 0xabc+i) }, "<uuid>"},
	} {
		a := New(Options{SampleEvery: 1, BlockUnits: 64, Decode: Runes})
		for i := 0; i < 6; i++ {
			a.Add(ToRunes(tc.stamp(i) + strings.Repeat(system, 2)))
		}
		if p := waitPatterns(t, a, 1)[0]; p.Shape != tc.want || p.Block != 0 {
			t.Errorf("%q: %+v, want %s", tc.stamp(0), p, tc.want)
		}
	}
}

func TestShape(t *testing.T) {
	for _, tc := range []struct {
		texts []string
		want  string
	}{
		{[]string{"at 2026-12-03T17:15:02Z now", "at 2026-12-03T17:15:09Z now"}, "<timestamp>"},
		{[]string{"date 2026-12-03 here", "date 2026-12-04 here"}, "<date>"},
		{[]string{"id 4711 x", "id 9135 x"}, "<digits:4>"},
		{[]string{"key 9f3a77c1e0 x", "key 0b12aa9e77 x"}, "<hex:10>"},
		{[]string{"hello Alice!", "hello Bob!"}, "<text:5>"},
	} {
		if got, _ := Shape(tc.texts); got != tc.want {
			t.Errorf("Shape(%q) = %s, want %s", tc.texts, got, tc.want)
		}
	}
}

// The anchor table stays within MaxAnchors however many unrelated prompts pass.
func TestAuditBoundedAnchors(t *testing.T) {
	a := New(Options{SampleEvery: 1, MaxAnchors: 100})
	defer a.Close()
	for i := 0; i < 500; i++ {
		a.Observe(vllmsim.Tokenize(fmt.Sprintf("%06d %s", i, strings.Repeat(fmt.Sprintf("%d-", i), 100))))
	}
	a.mu.Lock()
	n := len(a.anchors)
	a.mu.Unlock()
	if n > 100 {
		t.Fatalf("%d anchors, over 100", n)
	}
}

// The documented limit (docs/should-you-route.md, "What it misses"): a varying lead whose token
// count varies shifts every later block boundary, so no block recurs at the same position and
// nothing is reported, while the same lead at a fixed width is found.
func TestAuditMissesALeadOfVaryingLength(t *testing.T) {
	prompts := func(width func(i int) int) [][]uint32 {
		var out [][]uint32
		for i := 0; i < 12; i++ {
			lead := strings.Repeat("x ", width(i)) // a lead of width(i) tokens, different each time
			out = append(out, vllmsim.Tokenize(fmt.Sprintf("Visitor %d %s. ", i, lead)+strings.Repeat(system, 3)))
		}
		return out
	}
	for _, c := range []struct {
		name  string
		width func(int) int
		want  int
	}{{"fixed width", func(int) int { return 4 }, 1}, {"varying width", func(i int) int { return 1 + i%5 }, 0}} {
		a := New(Options{SampleEvery: 1, Decode: simDecode})
		for _, p := range prompts(c.width) {
			a.Observe(p)
		}
		a.Close()
		if got := len(a.Patterns()); got != c.want {
			t.Fatalf("%s: %d patterns, want %d: %+v", c.name, got, c.want, a.Patterns())
		}
	}
}
