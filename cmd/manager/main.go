// Command manager runs the KVRoutedModel operator: a controller-runtime manager with the one
// reconciler, metrics, health probes and optional leader election. It is built with
// CGO_ENABLED=0, so it must never import the router's ZMQ packages.
package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers"
	"github.com/kvroute/kvroute/controllers/render"
)

// LeaderElectionID is the Lease the replicas of the manager contend for.
const LeaderElectionID = "kvroute-operator.serving.kvroute.io"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	var (
		opts        render.Options
		metricsAddr string
		probeAddr   string
		leaderElect bool
	)
	fs.StringVar(&opts.DefaultEngineImage, "default-engine-image", render.DefaultEngineImage, "vLLM image for models that set no spec.engine.image")
	fs.StringVar(&opts.DefaultRouterImage, "default-router-image", render.DefaultRouterImage, "kvrouter image for models that set no spec.router.image")
	fs.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint; 0 turns it off")
	fs.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	fs.BoolVar(&leaderElect, "leader-elect", false, "elect a leader so only one replica reconciles")
	// klog rather than zap: it is already a dependency of every Kubernetes library here.
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if opts.DefaultEngineImage == "" || opts.DefaultRouterImage == "" {
		return fmt.Errorf("--default-engine-image and --default-router-image must not be empty")
	}
	ctrl.SetLogger(klog.NewKlogr())

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Cache:                  controllers.CacheOptions(),
		Metrics:                metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress: probeAddr,
		LeaderElection:         leaderElect,
		LeaderElectionID:       LeaderElectionID,
		// The process exits right after the manager stops, so releasing the lease early is
		// safe and lets a new leader take over at once.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("new manager: %w", err)
	}
	if err := controllers.NewReconciler(mgr, opts, clock.RealClock{}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up controller: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}
