// Package indexhealth proves the index-health path end to end through a real control plane
// (envtest) running the operator. TestKVRouterBinaryRaisesAndClearsIndexHealthy is the issue's
// whole proof at shipped timing: the kvrouter binary with the rendered config and Kubernetes
// discovery, engines backed by hack/podbacker, a fault provoked and cleared.
// TestWrongSeedRaisesIndexHealthy is the quicker in-process variant for a key-correctness
// reason: two vllm-sim engines publishing KV events, one of them hashing with the wrong
// PYTHONHASHSEED, and a kvrouter (in process, static discovery of the two sims) whose report
// reaches the KVRoutedModel as its router ServiceAccount. The fault must show as
// IndexHealthy=False naming the replica, Degraded=True/IndexUnhealthy with Ready untouched, and
// a Warning Event, read back through the API server.
package indexhealth

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/app"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/report"
	"github.com/kvroute/kvroute/sim/vllmsim"
	"github.com/kvroute/kvroute/test/envtestenv"
)

func startSim(t *testing.T, cfg vllmsim.Config) *vllmsim.Sim {
	t.Helper()
	cfg.KVEventsPort, cfg.KVReplayPort, cfg.TimeScale = -1, 0, 20
	sim, err := vllmsim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); _ = sim.Close() })
	if err := sim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return sim
}

func TestMain(m *testing.M) { testkit.Main(m) }

func TestWrongSeedRaisesIndexHealthy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	ctrl.SetLogger(logr.Discard())
	env, cfg, err := envtestenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	// The operator.
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Cache: controllers.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	r := controllers.NewReconciler(mgr, render.Options{DefaultEngineImage: "e:1", DefaultRouterImage: "r:1"}, clock.RealClock{})
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	go func() { _ = mgr.Start(ctx) }()
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}

	// The model, its rendered Role for the router, and a router pod.
	const ns = "llm"
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	m := &v1alpha1.KVRoutedModel{ObjectMeta: metav1.ObjectMeta{Name: "qwen", Namespace: ns},
		Spec: v1alpha1.KVRoutedModelSpec{Model: v1alpha1.ModelSpec{Name: "vllm-sim", URI: "hf://Qwen/Qwen3-0.6B"}}}
	if err := k8s.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "the router Role", func() error {
		return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: render.RouterName(m)}, &rbacv1.Role{})
	})
	routerPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "qwen-router-0", Namespace: ns, Labels: render.RouterSelector(m)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "kvrouter", Image: "r:1"}}}}
	if err := k8s.Create(ctx, routerPod); err != nil {
		t.Fatal(err)
	}
	rc, _ := render.RouterConfig(getModel(t, ctx, k8s, m))

	// Two engines; e1 hashes with another PYTHONHASHSEED than the model's (0).
	good := startSim(t, vllmsim.Config{})
	bad := startSim(t, vllmsim.Config{HashSeed: "7"})
	engines := []discovery.Engine{
		{Name: "e0", URL: good.URL(), Events: good.EventEndpoints(), Ready: true},
		{Name: "e1", URL: bad.URL(), Events: bad.EventEndpoints(), Ready: true},
	}

	// The router, configured as the operator renders it but with static engines, reporting as its
	// ServiceAccount.
	var logs testkit.LockedBuffer
	rcfg := config.Default()
	rcfg.BlockSize, rcfg.Hash, rcfg.Events.Replay = 16, rc.Hash, false
	rcfg.Policy = "round-robin" // both engines get traffic
	srv, err := app.New(app.Options{Config: rcfg, Source: discovery.NewStatic(engines), Model: rc.ServedModelName,
		HealthInterval: 250 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Run(ctx) }()
	<-srv.Synced()
	api := httptest.NewServer(srv.APIHandler())
	t.Cleanup(api.Close)
	asRouter := rest.CopyConfig(cfg)
	asRouter.Impersonate = rest.ImpersonationConfig{UserName: fmt.Sprintf("system:serviceaccount:%s:%s", ns, render.RouterName(m)),
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
	rep, err := report.New(asRouter, report.Options{Namespace: rc.Report.Namespace, Model: rc.Report.KVRoutedModel, Pod: routerPod.Name,
		Interval: 250 * time.Millisecond, Source: func() []report.Degraded { return flatten(srv) }})
	if err != nil {
		t.Fatal(err)
	}
	go rep.Run(ctx)
	testkit.Eventually(t, 30*time.Second, "IndexHealthy=True from the first report", func() error {
		return wantCondition(getModel(t, ctx, k8s, m), v1alpha1.ConditionIndexHealthy, metav1.ConditionTrue)
	})

	// The fault: traffic makes both engines store blocks; e1's hashes fail the parity check.
	var faultAt time.Time
	testkit.Eventually(t, 30*time.Second, "a parity mismatch on e1", func() error {
		for i := 0; i < 8; i++ {
			body := fmt.Sprintf(`{"model":"vllm-sim","max_tokens":1,"prompt":[%s]}`, prompt(i+int(time.Now().UnixNano()%1000)*8))
			resp, err := http.Post(api.URL+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		for _, e := range srv.Engines() {
			if e.Name == "e1" && e.Ranks[0].Counters["parity_mismatches"] > 0 {
				faultAt = time.Now()
				return nil
			}
		}
		return fmt.Errorf("no parity mismatch counted yet")
	})
	var got *v1alpha1.KVRoutedModel
	// The bound: within 60 s of the fault (here the intervals are short, so about a second).
	testkit.Eventually(t, 60*time.Second, "IndexHealthy=False naming e1/0", func() error {
		got = getModel(t, ctx, k8s, m)
		if err := wantCondition(got, v1alpha1.ConditionIndexHealthy, metav1.ConditionFalse); err != nil {
			return fmt.Errorf("%v; router degraded %+v; reports %+v; e1 %+v; logs:\n%s", err, srv.Degraded(), got.Status.RouterReports, srv.Engines()[1].Ranks[0].Counters, logs.String())
		}
		if c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionIndexHealthy); !strings.Contains(c.Message, "e1/0 hash-mismatch") {
			return fmt.Errorf("message %q does not name e1/0", c.Message)
		}
		return nil
	})
	t.Logf("IndexHealthy=False %v after the first parity mismatch", time.Since(faultAt).Round(time.Millisecond))
	if d := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionDegraded); d == nil || d.Status != metav1.ConditionTrue || d.Reason != v1alpha1.ReasonIndexUnhealthy {
		t.Fatalf("Degraded %+v", d)
	}
	if rd := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady); rd != nil && rd.Reason == v1alpha1.ReasonIndexUnhealthy {
		t.Fatalf("Ready took the index reason: %+v", rd)
	}
	testkit.Eventually(t, 30*time.Second, "a Warning IndexUnhealthy Event", func() error {
		evs := &eventsv1.EventList{}
		if err := k8s.List(ctx, evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == m.Name && e.Reason == v1alpha1.ReasonIndexUnhealthy && e.Type == corev1.EventTypeWarning {
				return nil
			}
		}
		return fmt.Errorf("none among %d events", len(evs.Items))
	})
}

func prompt(seed int) string {
	ids := make([]string, 48)
	for i := range ids {
		ids[i] = fmt.Sprint(1000 + (seed*7919+i*31)%100000)
	}
	return strings.Join(ids, ",")
}

func getModel(t *testing.T, ctx context.Context, k8s client.Client, m *v1alpha1.KVRoutedModel) *v1alpha1.KVRoutedModel {
	t.Helper()
	out := &v1alpha1.KVRoutedModel{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(m), out); err != nil {
		t.Fatal(err)
	}
	return out
}

func wantCondition(m *v1alpha1.KVRoutedModel, typ string, s metav1.ConditionStatus) error {
	c := meta.FindStatusCondition(m.Status.Conditions, typ)
	if c == nil || c.Status != s {
		return fmt.Errorf("%s is %+v, want %s", typ, c, s)
	}
	return nil
}

func flatten(srv *app.Router) []report.Degraded {
	var out []report.Degraded
	for rep, sts := range srv.Degraded() {
		for _, s := range sts {
			out = append(out, report.Degraded{Replica: rep, Reason: string(s.Reason), Since: s.Since, Detail: s.Detail})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Replica+string(out[i].Reason) < out[j].Replica+string(out[j].Reason)
	})
	return out
}
