package render

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/kvroute/kvroute/internal/suggest"
)

// ArgWarning is one spec.engine.args entry that is no option of the pinned engine's server.
type ArgWarning struct {
	// Index in spec.engine.args.
	Index int
	// Arg as written.
	Arg string
	// Suggestion is the nearest known flag ("--gpu-memory-utilization"), "" when none is close.
	Suggestion string
	// Of names the server and release the flag is not an option of ("`vllm serve` of vLLM v0.26.0").
	Of string
}

func (w ArgWarning) String() string {
	s := fmt.Sprintf("spec.engine.args[%d] %q is not an option of %s", w.Index, w.Arg, w.Of)
	if w.Suggestion != "" {
		s += "; did you mean " + w.Suggestion + "?"
	}
	return s
}

// flagTable is one engine server's options and how its parser spells them.
type flagTable struct {
	// of names the server and release, for warnings.
	of string
	// long: name without dashes -> whether the parser also takes --no-<name>.
	long map[string]bool
	// short aliases ("-tp") with their long names.
	short map[string]string
	// shortPrefixes are single-dash prefixes that take a value glued on ("-O" of -O3).
	shortPrefixes []string
	// underscores: the parser takes _ for - in long names (vLLM's); dots: --name.key sets a
	// field of a JSON-valued option (vLLM's).
	underscores, dots bool

	spellings func() []string // every spelling, sorted, for suggestions
}

func newFlagTable(t flagTable) *flagTable {
	t.spellings = sync.OnceValue(func() []string {
		var out []string
		for f, neg := range t.long {
			out = append(out, "--"+f)
			if neg {
				out = append(out, "--no-"+f)
			}
		}
		for s := range t.short {
			out = append(out, s)
		}
		sort.Strings(out)
		return out
	})
	return &t
}

// CheckEngineArgs is CheckEngineArgsFor of vLLM.
func CheckEngineArgs(args []string) []ArgWarning { return CheckEngineArgsFor("vllm", args) }

// CheckEngineArgsFor names the arguments that look like options (a leading dash, not a number)
// but are none of the options of kind's pinned server, each with the nearest known flag by
// edit distance. It only warns: the engine image may be newer than the list. Values (4096,
// JSON, a path) pass. An unknown kind checks nothing.
func CheckEngineArgsFor(kind string, args []string) []ArgWarning {
	s, ok := servers[kind]
	if !ok {
		return nil
	}
	t := s.flags()
	var out []ArgWarning
	for i, a := range args {
		if !strings.HasPrefix(a, "-") || a == "-" || isNumber(a) {
			continue
		}
		if known, suggestion := t.known(a); !known {
			out = append(out, ArgWarning{Index: i, Arg: a, Suggestion: suggestion, Of: t.of})
		}
	}
	return out
}

// known reports whether a is an option in one of the spellings t's parser takes: --name,
// --name=value, and as t allows --name.key, --no-name for booleans, underscores for dashes
// and the short aliases (-tp 2, -tp=2, -O3).
func (t *flagTable) known(a string) (bool, string) {
	if !strings.HasPrefix(a, "--") {
		name, _, _ := strings.Cut(a, "=")
		if _, ok := t.short[name]; ok {
			return true, ""
		}
		for _, p := range t.shortPrefixes {
			if strings.HasPrefix(name, p) {
				return true, ""
			}
		}
		return false, t.nearest(name)
	}
	name := a[2:]
	cut := "="
	if t.dots {
		cut = "=."
	}
	if i := strings.IndexAny(name, cut); i >= 0 {
		name = name[:i]
	}
	if t.underscores {
		name = strings.ReplaceAll(name, "_", "-")
	}
	if _, ok := t.long[name]; ok {
		return true, ""
	}
	if rest, ok := strings.CutPrefix(name, "no-"); ok && t.long[rest] {
		return true, ""
	}
	return false, t.nearest("--" + name)
}

// nearest is the known spelling closest to name, if close enough to be a misspelling of it.
func (t *flagTable) nearest(name string) string { return suggest.Nearest(name, t.spellings()) }

func isNumber(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}
