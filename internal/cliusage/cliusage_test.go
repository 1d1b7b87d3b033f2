package cliusage

import (
	"bytes"
	"flag"
	"slices"
	"strings"
	"testing"
)

func TestGroupedUsage(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.String("listen", ":8000", "API address")
	fs.String("policy", "kv", "policy")
	fs.Bool("stray", false, "in no group")
	var out bytes.Buffer
	groups := []Group{{"API", []string{"listen"}}, {"Policy", []string{"policy"}}}
	fs.SetOutput(&out)
	fs.Usage = Func(fs, &out, "usage: x", groups, "Example:\n  x --listen :1\n")
	if err := fs.Parse([]string{"--policy", "load", "--help"}); err != flag.ErrHelp {
		t.Fatal(err)
	}
	s := out.String()
	api, pol, other, ex := strings.Index(s, "\nAPI:\n  -listen"), strings.Index(s, "\nPolicy:\n  -policy"),
		strings.Index(s, "\nOther flags:\n  -stray"), strings.Index(s, "\nExample:")
	if api < 0 || pol < api || other < pol || ex < other {
		t.Errorf("order or content:\n%s", s)
	}
	// The default as declared, not as parsed before --help.
	if !strings.Contains(s, `policy (default "kv")`) {
		t.Errorf("default:\n%s", s)
	}
	if got := Ungrouped(fs, groups); !slices.Equal(got, []string{"stray"}) {
		t.Errorf("ungrouped %v", got)
	}
}
