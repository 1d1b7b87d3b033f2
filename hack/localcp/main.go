// Command localcp runs a local Kubernetes control plane (kube-apiserver + etcd, through
// controller-runtime's envtest, with the binaries hack/envtest-assets.sh caches) until it is
// interrupted, and writes an admin kubeconfig for it. There is no kubelet and no
// kube-controller-manager: objects are stored and validated, pods never run. `make demo`
// uses it in place of a cluster.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvroute/kvroute/test/envtestenv"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "localcp:", err)
		os.Exit(1)
	}
}

func run() error {
	// Its own flag set: controller-runtime registers --kubeconfig (to read one) on the global set.
	fs := flag.NewFlagSet("localcp", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "where to write the admin kubeconfig (required)")
	assets := fs.String("assets", "", "directory with kube-apiserver, etcd, kubectl (default: KUBEBUILDER_ASSETS or hack/envtest-assets.sh)")
	_ = fs.Parse(os.Args[1:])
	if *kubeconfig == "" {
		return fmt.Errorf("--kubeconfig is required")
	}
	dir := *assets
	if dir == "" {
		var err error
		if dir, err = envtestenv.AssetsDir(); err != nil {
			return err
		}
	}
	// Catch the signals before starting, so an early Ctrl-C still stops etcd and the apiserver.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)

	env := &envtest.Environment{BinaryAssetsDirectory: dir}
	if _, err := env.Start(); err != nil {
		return fmt.Errorf("start control plane from %s: %w", dir, err)
	}
	defer func() { _ = env.Stop() }()

	admin, err := env.AddUser(envtest.User{Name: "kvroute-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	b, err := admin.KubeConfig()
	if err != nil {
		return err
	}
	// Written to a temporary name and renamed, so a reader never sees half a file.
	tmp := *kubeconfig + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, *kubeconfig); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "localcp: control plane up at %s; kubeconfig %s\n", env.Config.Host, *kubeconfig)
	<-stop
	fmt.Fprintln(os.Stderr, "localcp: stopping")
	return nil
}
