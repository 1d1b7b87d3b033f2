package controllers

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/test/envtestenv"
)

// One control plane and one manager for the whole package: starting envtest costs seconds,
// so the tests share it and keep apart by namespace.
var (
	cfg       *rest.Config
	k8s       client.Client
	testClock = clocktesting.NewFakeClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	renderOpt = render.Options{DefaultEngineImage: "example.com/vllm:test", DefaultRouterImage: "example.com/kvrouter:test"}
)

const retryInterval = time.Second

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	// The manager's logs only when asked for: KVROUTE_TEST_LOGS=1.
	if os.Getenv("KVROUTE_TEST_LOGS") != "" {
		ctrl.SetLogger(klog.NewKlogr())
	} else {
		ctrl.SetLogger(logr.Discard())
	}
	env, c, err := envtestenv.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	cfg = c

	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  scheme,
		Cache:   CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	r := NewReconciler(mgr, renderOpt, testClock)
	r.RetryInterval = retryInterval
	if err := r.SetupWithManager(mgr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	code := m.Run()
	cancel()
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		return 1
	}
	return code
}

// eventually polls f until it returns nil, failing t with f's last error when timeout passes
// first: testkit.Eventually for this package's many calls, which name no condition of their own.
func eventually(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	testkit.Eventually(t, timeout, "condition", f)
}

func namespace(t *testing.T, name string) string {
	t.Helper()
	// Generated names keep -count=N runs apart (envtest has no namespace GC to wait for).
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: name + "-"}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// newModel creates a minimal KVRoutedModel; edit can change its spec first.
func newModel(t *testing.T, ns, name string, edit func(*v1alpha1.KVRoutedModel)) *v1alpha1.KVRoutedModel {
	t.Helper()
	m := &v1alpha1.KVRoutedModel{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       v1alpha1.KVRoutedModelSpec{Model: v1alpha1.ModelSpec{Name: "qwen3-0-6b", URI: "hf://Qwen/Qwen3-0.6B"}},
	}
	if edit != nil {
		edit(m)
	}
	if err := k8s.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return m
}

func getModel(t *testing.T, m *v1alpha1.KVRoutedModel) *v1alpha1.KVRoutedModel {
	t.Helper()
	out := &v1alpha1.KVRoutedModel{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(m), out); err != nil {
		t.Fatal(err)
	}
	return out
}

// condition returns "Status/Reason" of a condition, or "" when absent.
func condition(m *v1alpha1.KVRoutedModel, typ string) string {
	for _, c := range m.Status.Conditions {
		if c.Type == typ {
			return string(c.Status) + "/" + c.Reason
		}
	}
	return ""
}

// waitCondition waits for the condition to read want ("True/Reason") at the current generation.
func waitCondition(t *testing.T, m *v1alpha1.KVRoutedModel, typ, want string) *v1alpha1.KVRoutedModel {
	t.Helper()
	var got *v1alpha1.KVRoutedModel
	eventually(t, 20*time.Second, func() error {
		got = getModel(t, m)
		if got.Status.ObservedGeneration != got.Generation {
			return fmt.Errorf("observedGeneration %d, generation %d", got.Status.ObservedGeneration, got.Generation)
		}
		if c := condition(got, typ); c != want {
			return fmt.Errorf("%s is %q, want %q (conditions %s)", typ, c, want, describe(got.Status.Conditions))
		}
		return nil
	})
	return got
}

func describe(cs []metav1.Condition) string {
	var b strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&b, "[%s=%s %s: %s] ", c.Type, c.Status, c.Reason, c.Message)
	}
	return b.String()
}
