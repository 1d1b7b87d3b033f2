package indexhealth

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/internal/testkit"
)

// Scale from zero with every part real (issue 49): a model with spec.autoscaling.minReplicas 0
// at zero replicas, the operator in a control plane (no KEDA installed: the operator's own wake
// is what brings it up), hack/podbacker backing the engine Deployment with vllm-sim, and the
// kvrouter binary with the ConfigMap the operator rendered. A request sent at zero is held by
// the router (kvroute_router_held_requests 1), reported into the model's status, the operator
// scales the model to one through its /scale (a ScaledFromZero Event, counted), the backer
// starts the engine, and the request gets its 200; the gauge is back at 0, the hold counted it
// released, status.router.heldRequests is 0 again, and the backlog the answer measured reaches
// status.router.backlogSeconds.
func TestRequestAtZeroAnsweredAfterScaleUp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts a control plane")
	}
	routerBin, simBin, backerBin := testkit.Build(t, "./cmd/kvrouter"), testkit.Build(t, "./cmd/vllm-sim"), testkit.Build(t, "./hack/podbacker")
	op := startOperator(t)
	ctx, k8s := op.ctx, op.k8s

	const ns = "zero"
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	ports := freePortsOnPodIPs(t, 2)
	zero := int32(0)
	m := &v1alpha1.KVRoutedModel{ObjectMeta: metav1.ObjectMeta{Name: "qwen", Namespace: ns},
		Spec: v1alpha1.KVRoutedModelSpec{Replicas: &zero,
			Model: v1alpha1.ModelSpec{Name: "vllm-sim", URI: "hf://Qwen/Qwen3-0.6B"},
			Engine: v1alpha1.EngineSpec{Image: "ghcr.io/kvroute/vllm-sim:" + render.Version,
				Port: ports[0], KVEvents: v1alpha1.KVEventsSpec{BasePort: ports[1]}},
			Router: v1alpha1.RouterSpec{Replicas: new(int32(1))},
			Autoscaling: &v1alpha1.AutoscalingSpec{Provider: "KEDA", MinReplicas: &zero, MaxReplicas: 2,
				KEDA: &v1alpha1.KEDASpec{Prometheus: &v1alpha1.KEDAPrometheus{ServerAddress: "http://prometheus.monitoring:9090"}}}}}
	if err := k8s.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{}
	testkit.Eventually(t, 30*time.Second, "the router ConfigMap", func() error {
		return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: render.RouterName(m)}, cm)
	})
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cm.Data[render.RouterConfigKey]), 0o600); err != nil {
		t.Fatal(err)
	}
	admin := writeKubeconfig(t, op.cfg, filepath.Join(dir, "admin.kubeconfig"), "")
	asRouter := writeKubeconfig(t, op.cfg, filepath.Join(dir, "router.kubeconfig"),
		fmt.Sprintf("system:serviceaccount:%s:%s", ns, render.RouterName(m)))
	api, adm := freeAddr(t), freeAddr(t)
	startProc(t, "podbacker", backerBin, nil,
		"--kubeconfig", admin, "--namespace", ns, "--selector", "app.kubernetes.io/part-of=kvroute,serving.kvroute.io/model=qwen",
		"--vllm-sim", simBin, "--sim-arg=--time-scale=20", "--log-dir", dir, "--interval", "200ms",
		"--ready-url", "kvrouter=http://"+api+"/readyz")
	var routerPod string
	testkit.Eventually(t, 60*time.Second, "the router pod", func() error {
		pods := &corev1.PodList{}
		if err := k8s.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels(render.RouterSelector(m))); err != nil {
			return err
		}
		if len(pods.Items) != 1 {
			return fmt.Errorf("%d router pods", len(pods.Items))
		}
		routerPod = pods.Items[0].Name
		return nil
	})
	startProc(t, "kvrouter", routerBin, []string{"KUBECONFIG=" + asRouter, "POD_NAME=" + routerPod},
		"--config", cfgPath, "--listen", api, "--admin-listen", adm, "--log-format", "json")
	base, admURL := "http://"+api, "http://"+adm

	// At zero: the router is Ready (it must take the request to hold it), its report is in
	// the status, no engine pod exists.
	testkit.Eventually(t, 60*time.Second, "the router Ready and reporting at zero replicas", func() error {
		resp, err := httpc.Get(base + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz %d", resp.StatusCode)
		}
		got := getModel(t, ctx, k8s, m)
		if len(got.Status.RouterReports) != 1 || got.Status.Router == nil {
			return fmt.Errorf("reports %+v, router %+v", got.Status.RouterReports, got.Status.Router)
		}
		return nil
	})
	if got := getModel(t, ctx, k8s, m); *got.Spec.Replicas != 0 || got.Status.ReadyReplicas != 0 {
		t.Fatalf("before the request: spec.replicas %d, ready %d; want 0 and 0", *got.Spec.Replicas, got.Status.ReadyReplicas)
	}
	if v, err := metricValue(admURL, `kvroute_router_held_requests{model_name="vllm-sim"}`); err != nil || v != 0 {
		t.Fatalf("held_requests before the request: %v %v, want 0", v, err)
	}
	woken := testutil.ToFloat64(controllers.ScaledFromZero.WithLabelValues(ns, m.Name))

	type answer struct {
		status int
		body   string
		err    error
		took   time.Duration
	}
	done := make(chan answer, 1)
	sent := time.Now()
	go func() {
		c := &http.Client{Timeout: 3 * time.Minute}
		resp, err := c.Post(base+"/v1/completions", "application/json", strings.NewReader(completion(1)))
		if err != nil {
			done <- answer{err: err, took: time.Since(sent)}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- answer{status: resp.StatusCode, body: string(b), took: time.Since(sent)}
	}()
	testkit.Eventually(t, 30*time.Second, "the request held (kvroute_router_held_requests 1)", func() error {
		v, err := metricValue(admURL, `kvroute_router_held_requests{model_name="vllm-sim"}`)
		if err != nil {
			return err
		}
		if v != 1 {
			return fmt.Errorf("held_requests %v", v)
		}
		return nil
	})
	heldSeen := time.Since(sent)

	var a answer
	select {
	case a = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("no answer 2 minutes after the request; model %+v", getModel(t, ctx, k8s, m).Status)
	}
	if a.err != nil || a.status != http.StatusOK {
		t.Fatalf("answer %d %q (%v) after %v, want 200", a.status, a.body, a.err, a.took)
	}
	got := getModel(t, ctx, k8s, m)
	if *got.Spec.Replicas != 1 {
		t.Fatalf("spec.replicas %d after the answer, want 1", *got.Spec.Replicas)
	}
	if v, err := metricValue(admURL, `kvroute_router_held_requests{model_name="vllm-sim"}`); err != nil || v != 0 {
		t.Fatalf("held_requests after the answer: %v %v, want 0", v, err)
	}
	if v, err := metricValue(admURL, `kvroute_router_hold_requests_total{model_name="vllm-sim",outcome="released"}`); err != nil || v != 1 {
		t.Fatalf("hold released: %v %v, want 1", v, err)
	}
	if err := wantEvent(ctx, k8s, m, corev1.EventTypeNormal, v1alpha1.ReasonScaledFromZero, "1 request(s) held by 1 router(s)"); err != nil {
		t.Fatalf("ScaledFromZero Event: %v", err)
	}
	var wokeAt time.Time
	evs := &eventsv1.EventList{}
	if err := k8s.List(ctx, evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if e.Regarding.Name == m.Name && e.Reason == v1alpha1.ReasonScaledFromZero {
			wokeAt = e.EventTime.Time
		}
	}
	if n := testutil.ToFloat64(controllers.ScaledFromZero.WithLabelValues(ns, m.Name)) - woken; n != 1 {
		t.Fatalf("kvroute_operator_scaled_from_zero_total rose by %v, want 1", n)
	}
	testkit.Eventually(t, 30*time.Second, "status.router.heldRequests back to 0", func() error {
		if r := getModel(t, ctx, k8s, m).Status.Router; r == nil || r.HeldRequests != 0 {
			return fmt.Errorf("status.router %+v", r)
		}
		return nil
	})
	// The answer measured the drain rate: the backlog the router exports comes with its next
	// confirmation (report.DefaultHeartbeat).
	testkit.Eventually(t, 45*time.Second, "status.router.backlogSeconds", func() error {
		if r := getModel(t, ctx, k8s, m).Status.Router; r == nil || r.BacklogSeconds == nil {
			return fmt.Errorf("status.router %+v", r)
		}
		return nil
	})
	if _, err := metricValue(admURL, `kvroute_router_backlog_seconds{model_name="vllm-sim"}`); err != nil {
		t.Fatal(err)
	}
	t.Logf("request at zero replicas: held after %v, the model woken (ScaledFromZero) %v and answered 200 %v after it was sent",
		heldSeen.Round(10*time.Millisecond), wokeAt.Sub(sent).Round(10*time.Millisecond), a.took.Round(10*time.Millisecond))
}

// metricValue reads one series' value from the router's /metrics; the series is written as the
// page writes it, name and labels.
func metricValue(admURL, series string) (float64, error) {
	resp, err := httpc.Get(admURL + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("no %s on /metrics", series)
}
