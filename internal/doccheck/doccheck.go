// Package doccheck keeps the docs and the binaries' --help in step: every flag a binary defines is
// named somewhere in the user docs, and every flag the docs give a binary (in a command line, or
// in a flag table under one) is one it defines. The binaries' tests call Check with their own
// --help output.
package doccheck

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Docs are the files searched, relative to the repository root: the user docs and vllm-sim's
// reference beside its package.
var Docs = []string{"README.md", "docs/*.md", "sim/vllmsim/README.md"}

// Exceptions are flags a binary defines that the docs need not name, with why.
var Exceptions = map[string]map[string]string{
	"vllm-sim": {
		"prefix-caching-hash-algo": "vLLM's spelling of --hash-algo, accepted so vLLM command lines run",
		"max-num-batched-tokens":   "vLLM's spelling of --max-batched-tokens, accepted so vLLM command lines run",
	},
}

// helpFlag is a flag line of flag.PrintDefaults: two spaces, a dash, the name.
var helpFlag = regexp.MustCompile(`(?m)^  -([A-Za-z0-9][A-Za-z0-9_.-]*)`)

// HelpFlags are the flag names in a --help text printed by the flag package.
func HelpFlags(help string) []string {
	var out []string
	for _, m := range helpFlag.FindAllStringSubmatch(help, -1) {
		if !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	return out
}

// Mention is one place the docs give a flag to a binary.
type Mention struct {
	Flag  string
	Where string // file:line
	Table bool   // in a flag table, not a command line
}

// Check fails t for each of flags that no doc names and for each flag the docs give cmd
// (e.g. "kvrouter", "kvbench cache", "kvroutectl audit") that flags lacks.
func Check(t *testing.T, root, cmd string, flags []string) {
	t.Helper()
	if len(flags) == 0 {
		t.Fatalf("%s: no flags in its help", cmd)
	}
	files, err := docFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	for _, f := range files {
		all.WriteString(f.text)
	}
	exc := Exceptions[cmd]
	for _, f := range flags {
		if f == "h" || f == "help" || exc[f] != "" {
			continue
		}
		dashes := "--"
		if len(f) == 1 {
			dashes = "--?" // -f, as Go's one-letter flags are usually written
		}
		if !regexp.MustCompile(dashes + regexp.QuoteMeta(f) + `\b([^-]|$)`).MatchString(all.String()) {
			t.Errorf("%s --%s is in no doc (%s); add it to a flag table or list", cmd, f, strings.Join(Docs, ", "))
		}
	}
	for _, m := range Attributed(files, cmd) {
		if m.Flag != "help" && !slices.Contains(flags, m.Flag) {
			t.Errorf("%s: the docs give %s --%s, which it does not define", m.Where, cmd, m.Flag)
		}
	}
}

// InTable fails t for each of flags missing from cmd's flag table (a "| flag |" table after a
// code block that runs cmd), for a binary whose docs keep one table of all its flags.
func InTable(t *testing.T, root, cmd string, flags []string) {
	t.Helper()
	files, err := docFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, m := range Attributed(files, cmd) {
		if m.Table {
			listed[m.Flag] = true
		}
	}
	if len(listed) == 0 {
		t.Fatalf("no flag table for %s in %s", cmd, strings.Join(Docs, ", "))
	}
	for _, f := range flags {
		if f != "h" && f != "help" && !listed[f] {
			t.Errorf("%s --%s is not in its flag table", cmd, f)
		}
	}
}

type docFile struct {
	name string
	text string
}

func docFiles(root string) ([]docFile, error) {
	var out []docFile
	for _, pat := range Docs {
		names, err := filepath.Glob(filepath.Join(root, pat))
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			b, err := os.ReadFile(n)
			if err != nil {
				return nil, err
			}
			rel, _ := filepath.Rel(root, n)
			out = append(out, docFile{rel, string(b)})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no docs under %s", root)
	}
	return out, nil
}

var (
	codeSpan  = regexp.MustCompile("`[^`\n]+`")
	flagToken = regexp.MustCompile(`(?:^|[\s(\x60\[])--([a-z][a-z0-9-]*[a-z0-9])`)
	heading   = regexp.MustCompile(`^#{1,6} `)
)

// Attributed are the flags the docs give cmd: in the arguments after cmd in a fenced code block
// (continuation lines joined) or in a code span, and in the first cell of a "| flag |" table
// that follows, in the same section, a code block invoking cmd and no other binary.
func Attributed(files []docFile, cmd string) []Mention {
	var out []Mention
	for _, f := range files {
		lines := strings.Split(f.text, "\n")
		inCode := false
		var lastBlock []string // commands invoked in the section's last code block
		var block []string
		for i := 0; i < len(lines); i++ {
			line := lines[i]
			where := fmt.Sprintf("%s:%d", f.name, i+1)
			trim := strings.TrimSpace(line)
			if strings.HasPrefix(trim, "```") {
				if inCode {
					lastBlock = block
				}
				inCode, block = !inCode, nil
				continue
			}
			if inCode {
				for strings.HasSuffix(strings.TrimSpace(line), `\`) && i+1 < len(lines) {
					i++
					line = strings.TrimSuffix(strings.TrimSpace(line), `\`) + " " + lines[i]
				}
				for _, c := range invoked(line) {
					if !slices.Contains(block, c) {
						block = append(block, c)
					}
				}
				for _, fl := range argsOf(line, cmd) {
					out = append(out, Mention{fl, where, false})
				}
				continue
			}
			if heading.MatchString(line) {
				lastBlock = nil
				continue
			}
			if strings.HasPrefix(trim, "|") && isFlagTable(lines, i) && len(lastBlock) == 1 && lastBlock[0] == cmd {
				for ; i < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i]), "|"); i++ {
					cells := strings.Split(strings.ReplaceAll(strings.TrimSpace(lines[i]), `\|`, "/"), "|")
					if len(cells) > 1 {
						for _, m := range flagToken.FindAllStringSubmatch(cells[1], -1) {
							out = append(out, Mention{m[1], fmt.Sprintf("%s:%d", f.name, i+1), true})
						}
					}
				}
				i-- // the line after the table is read by the loop
				continue
			}
			for _, span := range codeSpan.FindAllString(line, -1) {
				for _, fl := range argsOf(strings.Trim(span, "`"), cmd) {
					out = append(out, Mention{fl, where, false})
				}
			}
		}
	}
	return out
}

// Commands whose arguments are told apart; a subcommand binary's name alone starts nothing.
var commands = []string{"kvrouter", "vllm-sim", "manager",
	"kvbench cache", "kvbench replay", "kvbench cost",
	"kvroutectl render", "kvroutectl hash", "kvroutectl decode", "kvroutectl assess", "kvroutectl audit", "kvroutectl version"}

func cmdPattern(cmd string) *regexp.Regexp {
	// At the start of a command: line start, space, a path (bin/kvrouter), a paren, $ or `.
	return regexp.MustCompile(`(?:^|[\s/($\x60])` + strings.ReplaceAll(regexp.QuoteMeta(cmd), " ", `\s+`) + `(?:\s|$)`)
}

// invoked are the known commands a line runs.
func invoked(line string) []string {
	var out []string
	for _, c := range commands {
		if len(starts(line, c)) > 0 {
			out = append(out, c)
		}
	}
	return out
}

// starts are the offsets just after each invocation of cmd in line: an occurrence that is a
// flag's value (--kvrouter bin/kvrouter) is none.
func starts(line, cmd string) []int {
	first := strings.Fields(cmd)[0]
	var out []int
	for _, loc := range cmdPattern(cmd).FindAllStringIndex(line, -1) {
		head := ""
		if !strings.HasPrefix(line[loc[0]:], first) {
			head = line[:loc[0]+1] // up to and with the separator
		}
		before := strings.Fields(head)
		if len(before) > 0 && !strings.HasSuffix(head, " ") && !strings.HasSuffix(head, "\t") {
			before = before[:len(before)-1] // a path prefix of the command itself
		}
		if n := len(before); n > 0 && strings.HasPrefix(before[n-1], "-") && !strings.Contains(before[n-1], "=") {
			continue
		}
		out = append(out, loc[1])
	}
	return out
}

// argsOf are the --flags after each invocation of cmd in line, up to the end of that command
// (a pipe, &&, ;, a redirection, a comment or the next known command).
func argsOf(line, cmd string) []string {
	var out []string
	for _, at := range starts(line, cmd) {
		rest := unquote(line[at:])
		if i := strings.IndexAny(rest, "|;&>#"); i >= 0 {
			rest = rest[:i]
		}
		for _, c := range commands {
			if s := starts(rest, c); len(s) > 0 {
				rest = rest[:max(0, strings.LastIndex(rest[:s[0]], strings.Fields(c)[0]))]
			}
		}
		for _, m := range flagToken.FindAllStringSubmatch(rest, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// unquote blanks quoted shell words, whose ; and | are not the shell's.
func unquote(s string) string {
	b := []byte(s)
	var q byte
	for i, c := range b {
		switch {
		case q != 0 && c == q:
			q = 0
		case q != 0:
			b[i] = 'x'
		case c == '\'' || c == '"':
			q = c
		}
	}
	return string(b)
}

// isFlagTable: line i is a table header whose first column is "flag".
func isFlagTable(lines []string, i int) bool {
	cells := strings.Split(strings.TrimSpace(lines[i]), "|")
	return len(cells) > 2 && strings.EqualFold(strings.TrimSpace(cells[1]), "flag") &&
		i+1 < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i+1]), "|-")
}
