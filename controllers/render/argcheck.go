package render

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/kvroute/kvroute/internal/suggest"
	"github.com/kvroute/kvroute/internal/vllmrelease"
)

// ArgWarning is one spec.engine.args entry that is no option of the pinned vLLM's `vllm serve`.
type ArgWarning struct {
	// Index in spec.engine.args.
	Index int
	// Arg as written.
	Arg string
	// Suggestion is the nearest known flag ("--gpu-memory-utilization"), "" when none is close.
	Suggestion string
}

func (w ArgWarning) String() string {
	s := fmt.Sprintf("spec.engine.args[%d] %q is not a `vllm serve` option of vLLM %s", w.Index, w.Arg, vllmrelease.FlagsTag)
	if w.Suggestion != "" {
		s += "; did you mean " + w.Suggestion + "?"
	}
	return s
}

// CheckEngineArgs names the arguments that look like options (a leading dash, not a number)
// but are none of vLLM's (vllmrelease.Flags), each with the nearest known flag by edit distance. It
// only warns: the engine image may be newer than the list. Values (4096, JSON, a path) pass.
func CheckEngineArgs(args []string) []ArgWarning {
	var out []ArgWarning
	for i, a := range args {
		if !strings.HasPrefix(a, "-") || a == "-" || isNumber(a) {
			continue
		}
		if known, suggestion := knownFlag(a); !known {
			out = append(out, ArgWarning{Index: i, Arg: a, Suggestion: suggestion})
		}
	}
	return out
}

// knownFlag reports whether a is an option vLLM's parser takes in one of its spellings:
// --name, --name=value, --name.key (JSON fields), --no-name for booleans, underscores for
// dashes, and the short aliases (-tp 2, -tp=2, -O3).
func knownFlag(a string) (bool, string) {
	if !strings.HasPrefix(a, "--") {
		name, _, _ := strings.Cut(a, "=")
		if vllmrelease.Short(name[1:]) != nil {
			return true, ""
		}
		if strings.HasPrefix(name, "-O") { // -O3, -O.level
			return true, ""
		}
		return false, nearestFlag(name)
	}
	name := a[2:]
	if i := strings.IndexAny(name, "=."); i >= 0 {
		name = name[:i]
	}
	name = strings.ReplaceAll(name, "_", "-")
	if f, _ := vllmrelease.Lookup(name); f != nil {
		return true, ""
	}
	return false, nearestFlag("--" + name)
}

// nearestFlag is the known long flag (or --no- form) closest to name, if close enough to be
// a misspelling of it.
func nearestFlag(name string) string { return suggest.Nearest(name, allFlagSpellings()) }

// allFlagSpellings lists every long flag, and --no-<flag> for booleans, sorted so a tie
// always resolves to the same suggestion.
var allFlagSpellings = sync.OnceValue(func() []string {
	var out []string
	for _, f := range vllmrelease.Flags {
		out = append(out, "--"+f.Name)
		if f.Arity == vllmrelease.BoolOpt {
			out = append(out, "--no-"+f.Name)
		}
		for _, a := range f.Aliases {
			out = append(out, "-"+a)
		}
	}
	sort.Strings(out)
	return out
})

func isNumber(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}
