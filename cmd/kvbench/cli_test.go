package main

import (
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/doccheck"
	"github.com/kvroute/kvroute/sim/fleet"
)

func TestVersionAndHelp(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}, {"-version"}} {
		out, _, rc := kvbench(t, args...)
		if rc != 0 || !strings.HasPrefix(out, "kvbench ") || !strings.Contains(out, runtime.Version()) {
			t.Errorf("%v: exit %d, %q", args, rc, out)
		}
	}
	for _, args := range [][]string{{"--help"}, {"help"}, {"cache", "--help"}, {"cache", "-h"}, {"replay", "--help"}} {
		_, stderr, rc := kvbench(t, args...)
		if rc != 0 || !strings.Contains(stderr, "usage: kvbench") {
			t.Errorf("%v: exit %d, %q", args, rc, stderr)
		}
	}
}

// A flag kvbench cache and kvbench replay share has one default, or each one's help names the
// other to say why not.
func TestSharedFlagsAgreeOrSayWhy(t *testing.T) {
	_, cache, _ := kvbench(t, "cache", "--help")
	_, replay, _ := kvbench(t, "replay", "--help")
	c, r := flagHelp(cache), flagHelp(replay)
	shared := 0
	for name, ch := range c {
		rh, ok := r[name]
		if !ok {
			continue
		}
		shared++
		if defaultOf(ch) != defaultOf(rh) && (!strings.Contains(ch, "kvbench replay") || !strings.Contains(rh, "kvbench cache")) {
			t.Errorf("--%s: cache default %q, replay default %q, and the help does not say why:\n%s\n%s",
				name, defaultOf(ch), defaultOf(rh), ch, rh)
		}
	}
	if shared < 5 {
		t.Fatalf("only %d shared flags found; the help parse is broken", shared)
	}
}

// flagHelp splits PrintDefaults output into each flag's text.
func flagHelp(help string) map[string]string {
	out := map[string]string{}
	name := ""
	for _, line := range strings.Split(help, "\n") {
		if strings.HasPrefix(line, "  -") {
			name = strings.Fields(line)[0][1:]
		}
		if name != "" {
			out[name] += line + "\n"
		}
	}
	return out
}

var defaultRE = regexp.MustCompile(`\(default ([^)]*)\)\s*$`)

func defaultOf(text string) string {
	if m := defaultRE.FindStringSubmatch(strings.TrimSpace(text)); m != nil {
		return m[1]
	}
	return ""
}

func TestFlagsMatchDocs(t *testing.T) {
	for _, sub := range []string{"cache", "replay", "cost"} {
		t.Run(sub, func(t *testing.T) {
			_, help, _ := kvbench(t, sub, "--help")
			doccheck.Check(t, "../..", "kvbench "+sub, doccheck.HelpFlags(help))
		})
	}
}

// The headline names each column's best, not the hit-rate leader everywhere, with ties.
func TestHeadlineBestPerColumn(t *testing.T) {
	rs := []*fleet.Result{
		{Policy: "llmd-default", HitRateBlocks: 0.932, TTFTP90: 2.25, ImbalanceP95: 1.40},
		{Policy: "kv", HitRateBlocks: 0.904, TTFTP90: 1.731, ImbalanceP95: 1.54},
		{Policy: "load", HitRateBlocks: 0.40, TTFTP90: 1.728, ImbalanceP95: 1.10},
	}
	want := "best per column: hit_blocks llmd-default 0.932 | ttft_p90_s kv, load 1.73 | imbalance_p95 load 1.10 (rows ordered by hit_blocks)"
	if got := headline(rs); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}
