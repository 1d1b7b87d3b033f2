// Command podbacker stands in for the kubelet in `make demo`: the local control plane has no
// kubelet, no Deployment controller and no garbage collector, so podbacker creates the pods of
// the selected Deployments (from their templates, owner-referenced), gives each a distinct
// loopback IP (127.0.0.2, 127.0.0.3, ...), runs the engine container's rendered command as is
// with vllm-sim as its vllm program (VLLM_SIM_WILDCARD_HOST puts the pod's all-interface binds
// on its IP), and marks the pod Running and Ready once the sim answers /health. It polls
// (every --interval) rather than watching: a demo-sized loop that is simple to stop and cannot
// miss an event.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "podbacker:", err)
		os.Exit(1)
	}
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, " ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func run() error {
	fs := flag.NewFlagSet("podbacker", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the control plane")
	ns := fs.String("namespace", "default", "namespace of the Deployments")
	sel := fs.String("selector", "app.kubernetes.io/part-of=kvroute", "label selector of the Deployments to back")
	simBin := fs.String("vllm-sim", "bin/vllm-sim", "vllm-sim binary run as the program vllm of engine containers")
	var simArgs, ready multiFlag
	fs.Var(&simArgs, "sim-arg", "the simulator's own flag (repeatable; passed in VLLM_SIM_ARGS), e.g. --sim-arg=--prefill-tokens-per-s=1250")
	fs.Var(&ready, "ready-url", "CONTAINER=URL: pods whose first container is CONTAINER are Ready while URL answers 200 (repeatable)")
	logDir := fs.String("log-dir", "", "one log file per sim here")
	interval := fs.Duration("interval", 300*time.Millisecond, "reconcile period")
	_ = fs.Parse(os.Args[1:])
	selector, err := labels.Parse(*sel)
	if err != nil {
		return fmt.Errorf("--selector: %w", err)
	}
	readyURL := map[string]string{}
	for _, r := range ready {
		k, v, ok := strings.Cut(r, "=")
		if !ok {
			return fmt.Errorf("--ready-url %q: want CONTAINER=URL", r)
		}
		readyURL[k] = v
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b := &Backer{Client: c, Namespace: *ns, Selector: selector, SimBin: *simBin, SimArgs: simArgs, ReadyURL: readyURL,
		LogDir: *logDir, Log: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	return b.Run(ctx, *interval)
}
