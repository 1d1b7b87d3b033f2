package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/doccheck"
)

func ctl(args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	rc := run(args, strings.NewReader(""), &out, &errb)
	return out.String(), errb.String(), rc
}

func TestVersionHelpAndUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		out, _, rc := ctl(args...)
		if rc != 0 || !strings.HasPrefix(out, "kvroutectl ") || !strings.Contains(out, runtime.Version()) {
			t.Errorf("%v: exit %d, %q", args, rc, out)
		}
	}
	for _, args := range [][]string{{"--help"}, {"help"}, {"render", "--help"}, {"hash", "--help"}, {"decode", "--help"},
		{"assess", "--help"}, {"audit", "--help"}, {"audit", "-h"}, {"epp-check", "--help"}} {
		if _, stderr, rc := ctl(args...); rc != 0 || !strings.Contains(stderr, "usage: kvroutectl") {
			t.Errorf("%v: exit %d, %q", args, rc, stderr)
		}
	}
	for _, args := range [][]string{{}, {"nope"}, {"render", "--nope"}, {"hash", "--nope"}, {"decode", "--nope"},
		{"assess", "--nope"}, {"audit", "--nope"}, {"audit"}, {"audit", "--bodies", "b", "--output", "xml"}, {"epp-check"}, {"epp-check", "127.0.0.1:1"}} {
		if _, stderr, rc := ctl(args...); rc != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, rc, stderr)
		}
	}
	// audit takes --bodies, --trace or both; its usage says so.
	if _, stderr, _ := ctl("audit", "--help"); !strings.Contains(stderr, "[--bodies requests.jsonl] [--trace") {
		t.Errorf("audit usage makes a flag look required:\n%s", stderr)
	}
}

func TestFlagsMatchDocs(t *testing.T) {
	for _, sub := range []string{"render", "hash", "decode", "assess", "audit", "epp-check"} {
		t.Run(sub, func(t *testing.T) {
			_, help, _ := ctl(sub, "--help")
			doccheck.Check(t, "../..", "kvroutectl "+sub, doccheck.HelpFlags(help))
		})
	}
}
