package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
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
	// KVBENCH_ROUTER_CPUPROFILE=FILE writes the router's CPU profile there on exit: how the
	// request path's cost is profiled (kvbench cost with a wrapper running `kvbench router`).
	if path := os.Getenv("KVBENCH_ROUTER_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}
	if code := cli.Run(ctx, args, stderr, cli.Options{Policies: policies.Registry()}); code != 0 {
		return exitCode(code)
	}
	return nil
}

// exitCode is a subcommand's exit status whose cause it already reported.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }
