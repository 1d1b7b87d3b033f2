package ship

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	lua "github.com/yuin/gopher-lua"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/status"
)

const argoHealthKey = "resource.customizations.health.serving.kvroute.io_KVRoutedModel"

// health runs config/argocd/health.lua on obj the way Argo CD does: obj as a Lua table
// decoded from the object's JSON, the script's returned table read for status and message.
func health(t *testing.T, script string, obj map[string]any) (string, string) {
	t.Helper()
	L := lua.NewState(lua.Options{SkipOpenLibs: false})
	defer L.Close()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var generic any
	if err := json.Unmarshal(raw, &generic); err != nil {
		t.Fatal(err)
	}
	L.SetGlobal("obj", toLua(L, generic))
	if err := L.DoString(script); err != nil {
		t.Fatalf("health.lua: %v", err)
	}
	ret, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		t.Fatalf("health.lua returned %s, not a table", L.Get(-1).Type())
	}
	return lua.LVAsString(ret.RawGetString("status")), lua.LVAsString(ret.RawGetString("message"))
}

func toLua(L *lua.LState, v any) lua.LValue {
	switch x := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(x)
	case float64:
		return lua.LNumber(x)
	case string:
		return lua.LString(x)
	case []any:
		tb := L.NewTable()
		for _, e := range x {
			tb.Append(toLua(L, e))
		}
		return tb
	case map[string]any:
		tb := L.NewTable()
		for k, e := range x {
			tb.RawSetString(k, toLua(L, e))
		}
		return tb
	}
	panic(fmt.Sprintf("toLua: %T", v))
}

func TestArgoCDConfigMapCarriesHealthLua(t *testing.T) {
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(readFile(t, "config/argocd/argocd-cm.yaml"), &cm); err != nil {
		t.Fatal(err)
	}
	if got, want := cm.Data[argoHealthKey], string(readFile(t, "config/argocd/health.lua")); got != want {
		t.Fatalf("argocd-cm.yaml's %s is not config/argocd/health.lua", argoHealthKey)
	}
}

func TestArgoCDApplicationExample(t *testing.T) {
	docs := decodeObjects(t, readFile(t, "config/argocd/application.yaml"))
	waves := map[string]string{}
	var model *unstructured.Unstructured
	for _, d := range docs {
		waves[d.GetName()] = d.GetAnnotations()["argocd.argoproj.io/sync-wave"]
		opts, _, _ := unstructured.NestedStringSlice(d.Object, "spec", "syncPolicy", "syncOptions")
		if !contains(opts, "ServerSideApply=true") {
			t.Errorf("Application %s does not sync with ServerSideApply=true", d.GetName())
		}
		if d.GetName() != "kvroute-operator" {
			model = d
			if !contains(opts, "RespectIgnoreDifferences=true") {
				t.Errorf("Application %s ignores /spec/replicas without RespectIgnoreDifferences=true", d.GetName())
			}
		}
	}
	if model == nil || waves["kvroute-operator"] >= waves[model.GetName()] {
		t.Fatalf("the operator (CRD) must sync in an earlier wave than the model: %v", waves)
	}
	ign, _, _ := unstructured.NestedSlice(model.Object, "spec", "ignoreDifferences")
	if b, _ := json.Marshal(ign); !strings.Contains(string(b), `"/spec/replicas"`) || !strings.Contains(string(b), `"KVRoutedModel"`) {
		t.Errorf("ignoreDifferences %s does not cover KVRoutedModel /spec/replicas", b)
	}
}

func contains(s []string, v string) bool {
	for _, e := range s {
		if e == v {
			return true
		}
	}
	return false
}

// TestArgoCDHealthOnRealStatus drives one KVRoutedModel on the API server through the states
// the controller writes (status from the status package, through the status subresource) and
// reads each back as JSON for the Lua script.
func TestArgoCDHealthOnRealStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	script := string(readFile(t, "config/argocd/health.lua"))
	dyn := dynamic.NewForConfigOrDie(restCfg)
	cs := kubernetes.NewForConfigOrDie(restCfg)
	installCRD(ctx, t)
	const ns = "argocd-health"
	ensureNamespace(ctx, t, cs, ns)
	models := dyn.Resource(modelGVR).Namespace(ns)

	sample := decodeObjects(t, readFile(t, "config/samples/serving_v1alpha1_kvroutedmodel_minimal.yaml"))[0]
	sample.SetNamespace(ns)
	sample.SetName("health")
	if _, err := models.Create(ctx, sample, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	get := func() (*unstructured.Unstructured, *v1alpha1.KVRoutedModel) {
		u, err := models.Get(ctx, "health", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m := &v1alpha1.KVRoutedModel{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, m); err != nil {
			t.Fatal(err)
		}
		return u, m
	}
	var reports []v1alpha1.RouterReport // router reports the next writeStatus carries
	writeStatus := func(o status.Observed) {
		t.Helper()
		u, m := get()
		o.Model, o.Now = m, time.Now()
		m.Status.RouterReports = reports
		st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ptr.To(status.Compute(o)))
		if err != nil {
			t.Fatal(err)
		}
		u.Object["status"] = st
		if _, err := models.UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update status: %v", err)
		}
	}
	patchSpec := func(patch string) {
		t.Helper()
		if _, err := models.Patch(ctx, "health", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(step, want string) {
		t.Helper()
		u, _ := get()
		got, msg := health(t, script, u.Object)
		if got != want {
			t.Errorf("%s: health %s (%q), want %s", step, got, msg, want)
		}
		if msg == "" {
			t.Errorf("%s: health %s has no message", step, got)
		}
	}
	ready := func(name string, want, readyN int32) *appsv1.Deployment {
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1},
			Spec:       appsv1.DeploymentSpec{Replicas: ptr.To(want)},
			Status: appsv1.DeploymentStatus{ObservedGeneration: 1, Replicas: want, UpdatedReplicas: want,
				ReadyReplicas: readyN, AvailableReplicas: readyN},
		}
	}

	expect("just created, no status", "Progressing")
	writeStatus(status.Observed{Engine: ready("health-engine", 1, 0), Router: ready("health-router", 1, 1)})
	expect("engine not Ready yet", "Progressing")
	writeStatus(status.Observed{Engine: ready("health-engine", 1, 1), Router: ready("health-router", 1, 1)})
	expect("engine and router Ready", "Healthy")
	patchSpec(`{"spec":{"replicas":2}}`)
	expect("new generation, status still for the old one", "Progressing")
	writeStatus(status.Observed{Engine: ready("health-engine", 2, 2), Router: ready("health-router", 1, 1),
		Problems: []status.Problem{{Reason: v1alpha1.ReasonKEDANotInstalled, Message: "KEDA is not installed"}}})
	expect("a problem", "Degraded")
	writeStatus(status.Observed{Engine: ready("health-engine", 2, 2), Router: ready("health-router", 1, 1)})
	expect("problem gone", "Healthy")
	patchSpec(`{"spec":{"suspend":true}}`)
	expect("suspend not yet observed", "Progressing")
	writeStatus(status.Observed{Engine: ready("health-engine", 2, 2), Router: ready("health-router", 1, 1), Suspended: true})
	expect("suspended", "Suspended")
	patchSpec(`{"spec":{"suspend":false}}`)
	now := metav1.Now()
	reports = []v1alpha1.RouterReport{{Pod: "health-router-a", ObservedAt: now,
		Degraded: []v1alpha1.DegradedReplica{{Replica: "health-engine-x/0", Reason: "no-events", Since: now, Detail: "no event in 1m0s"}}}}
	writeStatus(status.Observed{Engine: ready("health-engine", 2, 2), Router: ready("health-router", 1, 1)})
	expect("index stale on one replica: still Healthy", "Healthy")
	if _, msg := health(t, script, must(get())); !strings.Contains(msg, "health-engine-x/0 no-events") {
		t.Errorf("Healthy message %q does not name the unhealthy replica", msg)
	}
	reports[0].Degraded[0].Reason = "hash-mismatch"
	writeStatus(status.Observed{Engine: ready("health-engine", 2, 2), Router: ready("health-router", 1, 1)})
	expect("a replica's keys may be wrong", "Degraded")
	if _, msg := health(t, script, must(get())); !strings.HasPrefix(msg, v1alpha1.ReasonIndexUnhealthy+":") {
		t.Errorf("Degraded message %q", msg)
	}
}

func must(u *unstructured.Unstructured, _ *v1alpha1.KVRoutedModel) map[string]any { return u.Object }

// installCRD applies the CRD from dist/install.yaml (idempotent; another test may have).
func installCRD(ctx context.Context, t *testing.T) {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(restCfg)
	for _, o := range decodeObjects(t, readFile(t, "dist/install.yaml")) {
		if o.GetKind() == "CustomResourceDefinition" {
			apply(ctx, t, dyn, newMapper(), o)
			waitEstablished(ctx, t, dyn, o.GetName())
		}
	}
}
