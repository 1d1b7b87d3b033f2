// Command manager runs the KVRoutedModel operator: a controller-runtime manager with the one
// reconciler, metrics, health probes and optional leader election. It is built with
// CGO_ENABLED=0, so it must never import the router's ZMQ packages.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/internal/version"
)

// LeaderElectionID is the Lease the replicas of the manager contend for.
const LeaderElectionID = "kvroute-operator.serving.kvroute.io"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usageError is a bad command line: exit status 2, as for the flag package's own errors.
type usageError struct{ error }

// run is the process: 0 after a clean stop, --help or --version; 2 for a bad command line; 1
// when the manager cannot start or stops on an error.
func run(args []string, stdout, stderr io.Writer) int {
	err := start(args, stdout, stderr)
	var ue usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "manager:", err)
		return 2
	default:
		fmt.Fprintln(stderr, "manager:", err)
		return 1
	}
}

func start(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	fs.SetOutput(stderr)
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
	showVersion := fs.Bool("version", false, "print the version and exit")
	// klog rather than zap: it is already a dependency of every Kubernetes library here.
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if *showVersion {
		version.Print(stdout, "manager")
		return nil
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments: %v", fs.Args())}
	}
	if opts.DefaultEngineImage == "" || opts.DefaultRouterImage == "" {
		return usageError{errors.New("--default-engine-image and --default-router-image must not be empty")}
	}
	ctrl.SetLogger(klog.NewKlogr())
	// kvroute_build_info beside controller-runtime's own metrics on the manager's /metrics.
	if err := ctrlmetrics.Registry.Register(version.Collector()); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
		return err
	}

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
