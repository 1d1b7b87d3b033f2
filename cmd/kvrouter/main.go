// Command kvrouter is kvroute's KV-cache-aware, OpenAI-compatible router: router/cli's command
// line over router/app, offering the production policies only. Flags override the --config
// file; see docs/router.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvroute/kvroute/router/cli"
	"github.com/kvroute/kvroute/router/score"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(cli.Run(ctx, os.Args[1:], os.Stderr, cli.Options{Policies: score.Production()}))
}
