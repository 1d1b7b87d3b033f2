package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvroute/kvroute/router/cli"
	"github.com/kvroute/kvroute/sim/policies"
)

// runRouter is `kvbench router`, left out of the usage line: kvrouter's own command line and
// code (router/cli) with the benchmark policies (sim/policies) registered beside the production
// ones, so `kvbench replay` serves every policy live through the same router. kvrouter itself
// offers the production policies only. It logs the same "kvrouter listening" line.
func runRouter(args []string, _, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if code := cli.Run(ctx, args, stderr, cli.Options{Policies: policies.Registry()}); code != 0 {
		return exitCode(code)
	}
	return nil
}

// exitCode is a subcommand's exit status whose cause it already reported.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }
