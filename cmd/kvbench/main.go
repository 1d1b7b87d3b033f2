// Command kvbench measures routing policies: `kvbench cache` runs the deterministic fleet model
// (sim/fleet) over a trace; `kvbench replay` replays one live against vllm-sim engines and
// kvrouter (sim/replay).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/kvroute/kvroute/internal/version"
)

// subcommands maps a name to its entry point; each parses its own flags.
var subcommands = map[string]func(args []string, stdout, stderr io.Writer) error{
	"autoscale": runAutoscale,
	"cache":     runCache,
	"cost":      runCost,
	"replay":    runReplay,
	"router":    runRouter, // hidden: the routers kvbench replay starts (router.go)
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && (version.IsFlag(args[0]) || args[0] == "version") {
		version.Print(stdout, "kvbench")
		return 0
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(stderr, "usage: kvbench cache|replay --trace F [flags]   (kvbench cache -h, kvbench replay -h for flags)")
		fmt.Fprintln(stderr, "       kvbench cost [flags]                        (the router's own cost; kvbench cost -h)")
		fmt.Fprintln(stderr, "       kvbench autoscale [flags]                   (autoscaling signals on a load step, fleet model; kvbench autoscale -h)")
		fmt.Fprintln(stderr, "       kvbench --version")
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := subcommands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "kvbench: unknown subcommand %q (known: autoscale, cache, cost, replay)\n", args[0])
		return 2
	}
	if err := cmd(args[1:], stdout, stderr); err != nil {
		if code, ok := err.(exitCode); ok {
			return int(code)
		}
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "kvbench %s: %v\n", args[0], err)
		if errors.As(err, new(usageError)) {
			return 2
		}
		return 1
	}
	return 0
}

// usageError is a bad command line (exit status 2); other errors exit 1.
type usageError struct{ error }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// flagError is a FlagSet.Parse error as run reports it: --help stays flag.ErrHelp (exit 0), the
// rest are usage errors.
func flagError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return usageError{err}
}
