// Package cliusage prints a flag set's usage in titled groups (the flag package prints one
// alphabetical list), so a binary with many flags reads by task: where it listens, which engines,
// which policy, what it logs.
package cliusage

import (
	"flag"
	"fmt"
	"io"
)

// Group is a titled list of flag names, printed in this order.
type Group struct {
	Title string
	Flags []string
}

// Ungrouped names the flags of fs that no group lists, in the flag package's order; a binary's
// test asserts it is empty.
func Ungrouped(fs *flag.FlagSet, groups []Group) []string {
	in := map[string]bool{}
	for _, g := range groups {
		for _, n := range g.Flags {
			in[n] = true
		}
	}
	var out []string
	fs.VisitAll(func(f *flag.Flag) {
		if !in[f.Name] {
			out = append(out, f.Name)
		}
	})
	return out
}

// Func is a flag.FlagSet Usage: the synopsis, each group's flags as PrintDefaults formats them
// (defaults as declared, not as parsed so far), any flag no group names under "Other flags",
// and the closing text (examples).
func Func(fs *flag.FlagSet, w io.Writer, synopsis string, groups []Group, closing string) func() {
	return func() {
		fmt.Fprintln(w, synopsis)
		for _, g := range groups {
			print(w, fs, g.Title, g.Flags)
		}
		if rest := Ungrouped(fs, groups); len(rest) > 0 {
			print(w, fs, "Other flags", rest)
		}
		if closing != "" {
			fmt.Fprintf(w, "\n%s", closing)
		}
	}
}

func print(w io.Writer, fs *flag.FlagSet, title string, names []string) {
	sub := flag.NewFlagSet(title, flag.ContinueOnError)
	sub.SetOutput(w)
	for _, n := range names {
		f := fs.Lookup(n)
		if f == nil {
			continue
		}
		sub.Var(f.Value, f.Name, f.Usage)
		sub.Lookup(n).DefValue = f.DefValue
	}
	fmt.Fprintf(w, "\n%s:\n", title)
	sub.PrintDefaults()
}
