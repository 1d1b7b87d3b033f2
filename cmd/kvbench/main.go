// Command kvbench measures routing policies: `kvbench cache` runs the deterministic fleet model
// (sim/fleet) over a trace; `kvbench replay` replays one live against vllm-sim engines and
// kvrouter (sim/replay).
package main

import (
	"fmt"
	"io"
	"os"
)

// subcommands maps a name to its entry point; each parses its own flags.
var subcommands = map[string]func(args []string, stdout, stderr io.Writer) error{
	"cache":  runCache,
	"replay": runReplay,
	"router": runRouter, // hidden: the routers kvbench replay starts (router.go)
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(stderr, "usage: kvbench cache|replay --trace F [flags]   (kvbench cache -h, kvbench replay -h for flags)")
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := subcommands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "kvbench: unknown subcommand %q (known: cache, replay)\n", args[0])
		return 2
	}
	if err := cmd(args[1:], stdout, stderr); err != nil {
		if code, ok := err.(exitCode); ok {
			return int(code)
		}
		fmt.Fprintf(stderr, "kvbench %s: %v\n", args[0], err)
		return 1
	}
	return 0
}
