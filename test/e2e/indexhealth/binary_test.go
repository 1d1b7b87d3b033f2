package indexhealth

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/kvevents"
	"github.com/kvroute/kvroute/test/envtestenv"
)

// The proof, with every part real and at its shipped timing: a control plane
// (envtest), the operator, hack/podbacker backing the engine Deployment the operator rendered
// with vllm-sim processes, and the kvrouter binary run with the ConfigMap the operator rendered
// (Kubernetes discovery of the engine pods, its report written as the router's
// ServiceAccount through RBAC the operator rendered), its health samples every 5 s. One engine
// keeps serving but stops publishing KV events; IndexHealthy=False must name it, with a Warning
// Event, within 60 s, on /metrics and in /debug/engines too; when it publishes again, the
// condition recovers, also within 60 s.
func TestKVRouterBinaryRaisesAndClearsIndexHealthy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts a control plane")
	}
	routerBin, simBin, backerBin := testkit.Build(t, "./cmd/kvrouter"), testkit.Build(t, "./cmd/vllm-sim"), testkit.Build(t, "./hack/podbacker")
	op := startOperator(t)
	ctx, k8s := op.ctx, op.k8s

	const ns = "llm"
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	// The backer gives pods 127.0.0.2, .3, ... and the engines bind the rendered ports there,
	// so the ports are picked free on those addresses.
	ports := freePortsOnPodIPs(t, 3)
	two, replay := int32(2), ports[2]
	m := &v1alpha1.KVRoutedModel{ObjectMeta: metav1.ObjectMeta{Name: "qwen", Namespace: ns},
		Spec: v1alpha1.KVRoutedModelSpec{Replicas: &two,
			Model: v1alpha1.ModelSpec{Name: "vllm-sim", URI: "hf://Qwen/Qwen3-0.6B"},
			// The simulator's image, as in config/samples' sim sample: podbacker runs the engine
			// command rendered for it as is, vllm-sim standing in for vllm.
			Engine: v1alpha1.EngineSpec{Image: "ghcr.io/kvroute/vllm-sim:" + render.Version,
				Port: ports[0], KVEvents: v1alpha1.KVEventsSpec{BasePort: ports[1], ReplayBasePort: &replay}},
			// Round-robin: both engines get traffic. One router: the test runs one kvrouter
			// process as the router pod.
			Router: v1alpha1.RouterSpec{Policy: "round-robin", Replicas: new(int32(1))}}}
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
	logs := startProc(t, "kvrouter", routerBin, []string{"KUBECONFIG=" + asRouter, "POD_NAME=" + routerPod},
		"--config", cfgPath, "--listen", api, "--admin-listen", adm, "--log-format", "json")
	base, admURL := "http://"+api, "http://"+adm

	// Both engines discovered from their pods, traffic through both, both streams exact.
	var engines []engineDebug
	n := 0
	testkit.Eventually(t, 60*time.Second, "two engines with exact streams", func() error {
		post(t, base+"/v1/completions", completion(n))
		n++
		var err error
		if engines, err = debugEngines(admURL); err != nil {
			return err
		}
		if len(engines) != 2 {
			return fmt.Errorf("%d engines discovered", len(engines))
		}
		for _, e := range engines {
			if e.Ranks[0].Stream != "exact" {
				return fmt.Errorf("%s stream %s", e.Name, e.Ranks[0].Stream)
			}
		}
		return nil
	})
	testkit.Eventually(t, 30*time.Second, "IndexHealthy=True from the router's report", func() error {
		got := getModel(t, ctx, k8s, m)
		if len(got.Status.RouterReports) == 0 || got.Status.RouterReports[0].Pod != routerPod {
			return fmt.Errorf("reports %+v", got.Status.RouterReports)
		}
		return wantCondition(got, v1alpha1.ConditionIndexHealthy, metav1.ConditionTrue)
	})

	// The fault: one engine keeps serving and publishes nothing.
	bad := engines[1]
	replica := bad.Name + "/0"
	stall(t, bad.URL, true)
	faultAt := time.Now()
	var got *v1alpha1.KVRoutedModel
	testkit.Eventually(t, 60*time.Second, "IndexHealthy=False naming "+replica, func() error {
		post(t, base+"/v1/completions", completion(n))
		n++
		got = getModel(t, ctx, k8s, m)
		if err := wantCondition(got, v1alpha1.ConditionIndexHealthy, metav1.ConditionFalse); err != nil {
			return err
		}
		if c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionIndexHealthy); c.Reason != v1alpha1.ReasonIndexUnhealthy ||
			!strings.Contains(c.Message, replica+" no-events") {
			return fmt.Errorf("IndexHealthy %s %q does not name %s no-events", c.Reason, c.Message, replica)
		}
		return nil
	})
	raised := time.Since(faultAt)
	if raised > 60*time.Second {
		t.Fatalf("IndexHealthy=False %v after the fault, want within 60 s", raised)
	}
	testkit.Eventually(t, 60*time.Second-raised, "a Warning IndexUnhealthy Event naming "+replica, func() error {
		return wantEvent(ctx, k8s, m, corev1.EventTypeWarning, v1alpha1.ReasonIndexUnhealthy, replica)
	})
	t.Logf("no-events on %s: IndexHealthy=False and its Event %v after the engine stopped publishing", replica, time.Since(faultAt).Round(100*time.Millisecond))
	// The same reason on the router's own surfaces.
	if err := wantDegraded(admURL, bad.Name, "no-events", true); err != nil {
		t.Fatal(err)
	}
	// no-events is not evidence of wrong keys: Degraded stays clear, Ready is untouched.
	if d := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionDegraded); d != nil && d.Reason == v1alpha1.ReasonIndexUnhealthy {
		t.Fatalf("Degraded %+v for no-events", d)
	}
	if rd := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady); rd != nil && rd.Reason == v1alpha1.ReasonIndexUnhealthy {
		t.Fatalf("Ready took the index reason: %+v", rd)
	}

	// The fault clears: the held batches go out, and the condition recovers.
	stall(t, bad.URL, false)
	clearedAt := time.Now()
	testkit.Eventually(t, 60*time.Second, "IndexHealthy=True again", func() error {
		post(t, base+"/v1/completions", completion(n))
		n++
		return wantCondition(getModel(t, ctx, k8s, m), v1alpha1.ConditionIndexHealthy, metav1.ConditionTrue)
	})
	t.Logf("IndexHealthy=True %v after the engine published again", time.Since(clearedAt).Round(100*time.Millisecond))
	testkit.Eventually(t, 30*time.Second, "a Normal IndexHealthy Event", func() error {
		return wantEvent(ctx, k8s, m, corev1.EventTypeNormal, v1alpha1.ReasonIndexHealthy, "")
	})
	if err := wantDegraded(admURL, bad.Name, "no-events", false); err != nil {
		t.Fatal(err)
	}
	// Logged once each way, with its reason.
	began, ended := strings.Count(logs.String(), `"msg":"replica degraded","replica":"`+replica+`","reason":"no-events"`),
		strings.Count(logs.String(), `"msg":"replica no longer degraded","replica":"`+replica+`","reason":"no-events"`)
	if began != 1 || ended != 1 {
		t.Fatalf("no-events logged %d times began and %d ended, want once each; logs:\n%s", began, ended, logs.String())
	}

	// Small traffic: the publisher stops again and the replica then gets one block-storing
	// request, too few for the evidence of degraded.QuietRequests. The model must still name it
	// within 60 s of the replica's last event (its last_event in /debug/engines), with no more
	// traffic to help.
	stall(t, bad.URL, true)
	time.Sleep(kvevents.QuietAfter + 500*time.Millisecond) // the request must come past the last batch to be evidence
	served := func() uint64 {
		es, err := debugEngines(admURL)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			if e.Name == bad.Name {
				return e.Ranks[0].Accuracy.Responses
			}
		}
		t.Fatalf("%s not in /debug/engines", bad.Name)
		return 0
	}
	was := served()
	post(t, base+"/v1/completions", completion(n)) // round-robin: one request to each engine
	post(t, base+"/v1/completions", completion(n+1))
	testkit.Eventually(t, 5*time.Second, "the answer counted", func() error {
		if got := served() - was; got == 0 {
			return fmt.Errorf("no request reached %s", replica)
		}
		return nil
	})
	if got := served() - was; got != 1 {
		t.Fatalf("%d requests reached %s, want exactly 1", got, replica)
	}
	var lastEvent time.Time
	testkit.Eventually(t, 90*time.Second, "IndexHealthy=False naming "+replica+" after one request", func() error {
		c := meta.FindStatusCondition(getModel(t, ctx, k8s, m).Status.Conditions, v1alpha1.ConditionIndexHealthy)
		if c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, replica+" no-events") {
			return fmt.Errorf("IndexHealthy %+v", c)
		}
		es, err := debugEngines(admURL)
		if err != nil {
			return err
		}
		for _, e := range es {
			if e.Name == bad.Name && e.Ranks[0].LastEvent != nil {
				lastEvent = *e.Ranks[0].LastEvent
			}
		}
		return nil
	})
	shown := time.Since(lastEvent)
	t.Logf("small traffic: IndexHealthy=False naming %s no-events %v after its last event (one request served)", replica, shown.Round(100*time.Millisecond))
	if lastEvent.IsZero() || shown > 60*time.Second {
		t.Fatalf("no-events on one request shown %v after the last event (%v), want within 60 s", shown, lastEvent)
	}
	if err := wantDegraded(admURL, bad.Name, "no-events", true); err != nil {
		t.Fatal(err)
	}
}

// operator is a control plane with the operator running in it.
type operator struct {
	ctx context.Context
	cfg *rest.Config
	k8s client.Client
}

func startOperator(t *testing.T) operator {
	t.Helper()
	ctrl.SetLogger(logr.Discard())
	env, cfg, err := envtestenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	k8s := runOperator(t, ctx, cfg)
	return operator{ctx: ctx, cfg: cfg, k8s: k8s}
}

// runOperator runs the operator's reconciler in a manager against cfg until ctx ends, and
// returns a client of the control plane.
func runOperator(t *testing.T, ctx context.Context, cfg *rest.Config) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	skip := true // the package's other test runs a manager of its own in this process
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Cache: controllers.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"}, Controller: ctrlconfig.Controller{SkipNameValidation: &skip}})
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
	return k8s
}

// startProc runs a binary until the test ends: SIGTERM, then SIGKILL after 5 s. Its output is
// kept and shown if the test fails.
func startProc(t *testing.T, name, bin string, env []string, args ...string) *testkit.LockedBuffer {
	t.Helper()
	out := &testkit.LockedBuffer{}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, out.String())
		}
	})
	return out
}

// writeKubeconfig writes a kubeconfig for the control plane; impersonate, when set, makes every
// call as that ServiceAccount (its RBAC is the operator's).
func writeKubeconfig(t *testing.T, cfg *rest.Config, path, impersonate string) string {
	t.Helper()
	auth := &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	if impersonate != "" {
		ns := strings.Split(impersonate, ":")[2]
		auth.Impersonate = impersonate
		auth.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	}
	kc := clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"envtest": {Server: cfg.Host, CertificateAuthorityData: cfg.CAData}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"user": auth},
		Contexts:       map[string]*clientcmdapi.Context{"envtest": {Cluster: "envtest", AuthInfo: "user"}},
		CurrentContext: "envtest",
	}
	if err := clientcmd.WriteToFile(kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func freeAddr(t *testing.T) string { return fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t)) }

// freePortsOnPodIPs returns n distinct ports free on 127.0.0.1 and on the first pod IPs the
// backer hands out (127.0.0.2 to 127.0.0.5).
func freePortsOnPodIPs(t *testing.T, n int) []int32 {
	t.Helper()
	var out []int32
	seen := map[int]bool{}
	for tries := 0; len(out) < n && tries < 200; tries++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ok := !seen[port]
		for ip := 2; ok && ip <= 5; ip++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:%d", ip, port))
			if err != nil {
				ok = false
				continue
			}
			l.Close()
		}
		ln.Close()
		if ok {
			seen[port] = true
			out = append(out, int32(port))
		}
	}
	if len(out) < n {
		t.Fatalf("found %d free ports, want %d", len(out), n)
	}
	return out
}

// completion is a request of 64 distinct token ids (four 16-token blocks), so every one
// stores blocks on the engine that serves it.
func completion(seed int) string {
	return fmt.Sprintf(`{"model":"vllm-sim","max_tokens":1,"prompt":[%s]}`, ids64(seed))
}

func ids64(seed int) string {
	ids := make([]string, 64)
	for i := range ids {
		ids[i] = fmt.Sprint(1000 + (seed*104729+i*31)%100000)
	}
	return strings.Join(ids, ",")
}

var httpc = &http.Client{Timeout: 10 * time.Second}

func post(t *testing.T, url, body string) {
	t.Helper()
	resp, err := httpc.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return // the router may not listen yet; the caller's wait retries
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// stall stops or resumes the engine's KV-event publisher (vllm-sim's POST /debug/events).
func stall(t *testing.T, engineURL string, on bool) {
	t.Helper()
	resp, err := httpc.Post(engineURL+"/debug/events", "application/json", strings.NewReader(fmt.Sprintf(`{"stall":%v}`, on)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stall %v: %d", on, resp.StatusCode)
	}
}

type engineDebug struct {
	Name  string `json:"name"`
	URL   string `json:"url"`
	Ranks []struct {
		Stream    string     `json:"stream"`
		LastEvent *time.Time `json:"last_event"`
		Accuracy  struct {
			Responses uint64 `json:"responses"`
		} `json:"accuracy"`
		Degraded []struct {
			Reason string `json:"reason"`
		} `json:"degraded"`
	} `json:"ranks"`
}

func debugEngines(admURL string) ([]engineDebug, error) {
	resp, err := httpc.Get(admURL + "/debug/engines")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var dbg struct {
		Engines []engineDebug `json:"engines"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&dbg); err != nil {
		return nil, err
	}
	return dbg.Engines, nil
}

// wantDegraded checks /debug/engines and the replica_degraded gauge of the engine's rank 0.
func wantDegraded(admURL, engine, reason string, want bool) error {
	es, err := debugEngines(admURL)
	if err != nil {
		return err
	}
	found := false
	for _, e := range es {
		if e.Name != engine {
			continue
		}
		for _, d := range e.Ranks[0].Degraded {
			found = found || d.Reason == reason
		}
	}
	if found != want {
		return fmt.Errorf("/debug/engines: %s %s degraded %v, want %v (%+v)", engine, reason, found, want, es)
	}
	resp, err := httpc.Get(admURL + "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	series := fmt.Sprintf(`kvroute_router_replica_degraded{engine=%q,rank="0",reason=%q} `, engine, reason)
	value := "0"
	if want {
		value = "1"
	}
	if !strings.Contains(string(b), series+value+"\n") {
		return fmt.Errorf("/metrics has no %s%s", series, value)
	}
	return nil
}

// wantEvent finds an Event on the model of that type and reason whose note mentions what.
func wantEvent(ctx context.Context, k8s client.Client, m *v1alpha1.KVRoutedModel, typ, reason, what string) error {
	evs := &eventsv1.EventList{}
	if err := k8s.List(ctx, evs, client.InNamespace(m.Namespace)); err != nil {
		return err
	}
	for _, e := range evs.Items {
		if e.Regarding.Name == m.Name && e.Type == typ && e.Reason == reason && strings.Contains(e.Note, what) {
			return nil
		}
	}
	return fmt.Errorf("none among %d events", len(evs.Items))
}
