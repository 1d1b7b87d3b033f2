// Command kvroutectl is kvroute's offline toolbox: render a KVRoutedModel's children without a
// cluster, compute vLLM-exact block hashes, decode KV-event payloads, and assess whether a vLLM
// fleet's traffic deserves a KV-aware router at all.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/kvroute/kvroute/internal/version"
)

// command is one subcommand: it gets its own arguments and the process's streams and returns
// the exit code, so each can be tested without exec.
type command struct {
	summary string
	run     func(args []string, stdin io.Reader, stdout, stderr io.Writer) int
}

var commands = map[string]command{
	"render":    {"render a KVRoutedModel's child objects as YAML (no cluster needed)", runRender},
	"hash":      {"vLLM-exact block hashes for token ids, as JSON", runHash},
	"decode":    {"decode one KV-event payload into normalized JSON", runDecode},
	"assess":    {"read a vLLM fleet's counters and say whether routing by KV cache is worth it", runAssess},
	"audit":     {"find prompts whose start varies while the rest repeats (captured trace, request bodies, or both)", runAudit},
	"epp-check": {"play the gateway in front of an endpoint picker (Gateway API Inference Extension) and check it", runEPPCheck},
	"version": {"print the version, commit, build date and Go version", func(_ []string, _ io.Reader, stdout, _ io.Writer) int {
		version.Print(stdout, "kvroutectl")
		return 0
	}},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && version.IsFlag(args[0]) {
		args = []string{"version"}
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "kvroutectl: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	return cmd.run(args[1:], stdin, stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: kvroutectl <command> [flags]\n\ncommands:")
	for _, name := range []string{"render", "hash", "decode", "assess", "audit", "epp-check", "version"} {
		fmt.Fprintf(w, "  %-9s %s\n", name, commands[name].summary)
	}
	fmt.Fprintln(w, "\nkvroutectl <command> --help for a command's flags.")
}
