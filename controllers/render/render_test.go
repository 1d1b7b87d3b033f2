package render_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/router/config"
)

func engine(t *testing.T, m *v1alpha1.KVRoutedModel) (*appsv1.Deployment, corev1.Container) {
	t.Helper()
	d, err := render.EngineDeployment(m, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	return d, d.Spec.Template.Spec.Containers[0]
}

func argValue(args []string, flag string) (string, bool) {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

func TestDP2HasOneEventAndReplayPortPerRank(t *testing.T) {
	m := sample(t, "dp2tp2")
	d, c := engine(t, m)
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	want := map[string]int32{"http": 8000, "kv-events-0": 5557, "kv-events-1": 5558, "kv-replay-0": 5600, "kv-replay-1": 5601}
	if !reflect.DeepEqual(ports, want) {
		t.Errorf("container ports = %v, want %v", ports, want)
	}
	a := d.Spec.Template.Annotations
	if a[v1alpha1.AnnotationKVEvents] != "5557,5558" || a[v1alpha1.AnnotationKVReplay] != "5600,5601" || a[v1alpha1.AnnotationBlock] != "32" {
		t.Errorf("contract annotations = %v", a)
	}
	if v, _ := argValue(c.Args, "--data-parallel-size"); v != "2" {
		t.Errorf("--data-parallel-size = %q", v)
	}
	if v, _ := argValue(c.Args, "--tensor-parallel-size"); v != "2" {
		t.Errorf("--tensor-parallel-size = %q", v)
	}
	gpu := c.Resources.Limits[render.GPUResource]
	if gpu.Value() != 4 || c.Resources.Requests.Name(render.GPUResource, resource.DecimalSI).Value() != 4 {
		t.Errorf("GPUs = %v / %v, want tensor x dataLocal = 4", c.Resources.Requests, c.Resources.Limits)
	}
	svc := render.EngineService(m)
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || len(svc.Spec.Ports) != 5 {
		t.Errorf("engine Service not headless with 5 ports: %+v", svc.Spec)
	}
	if p := render.EnginePorts(m); !reflect.DeepEqual(p.Events, []int32{5557, 5558}) || !reflect.DeepEqual(p.Replay, []int32{5600, 5601}) {
		t.Errorf("EnginePorts = %+v", p)
	}
}

func TestKVEventsConfigJSON(t *testing.T) {
	m := sample(t, "dp2tp2")
	_, c := engine(t, m)
	raw, ok := argValue(c.Args, "--kv-events-config")
	if !ok {
		t.Fatal("no --kv-events-config")
	}
	var cfg map[string]interface{}
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatalf("not JSON: %v: %s", err, raw)
	}
	want := map[string]interface{}{
		"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
		"replay_endpoint": "tcp://*:5600", "topic": "kv@$(POD_IP)@llama-3-70b",
		"hwm": float64(100000), "buffer_steps": float64(10000),
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("kv-events-config = %v, want %v", cfg, want)
	}
	// $(POD_IP) only expands if POD_IP is defined in the container from the downward API.
	if c.Env[0].Name != "POD_IP" || c.Env[0].ValueFrom == nil || c.Env[0].ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Errorf("POD_IP env = %+v", c.Env[0])
	}
}

func TestEngineArgsOrderAndOwnedFlags(t *testing.T) {
	m := sample(t, "dp2tp2")
	_, c := engine(t, m)
	if !reflect.DeepEqual(c.Command, []string{"vllm", "serve"}) {
		t.Errorf("command = %v", c.Command)
	}
	if c.Args[0] != "meta-llama/Llama-3.3-70B-Instruct" {
		t.Errorf("model arg = %q", c.Args[0])
	}
	for flag, want := range map[string]string{
		"--served-model-name": "llama-3-70b", "--port": "8000", "--block-size": "32",
		"--prefix-caching-hash-algo": "sha256_cbor", "--revision": "6f6073b423013f6a7d4d9f39144961bfbfbc386b",
	} {
		if v, ok := argValue(c.Args, flag); !ok || v != want {
			t.Errorf("%s = %q, want %q", flag, v, want)
		}
	}
	joined := strings.Join(c.Args, " ")
	if !strings.Contains(joined, "--enable-prompt-tokens-details") {
		t.Error("--enable-prompt-tokens-details missing: vLLM would report no cached_tokens")
	}
	if !strings.HasSuffix(joined, "--max-model-len 32768 --gpu-memory-utilization=0.92") {
		t.Errorf("user args are not last: %s", joined)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if env["PYTHONHASHSEED"].Value != "42" {
		t.Errorf("PYTHONHASHSEED = %q", env["PYTHONHASHSEED"].Value)
	}
	if r := env["HF_TOKEN"].ValueFrom; r == nil || r.SecretKeyRef.Name != "hf-token" || r.SecretKeyRef.Key != "token" {
		t.Errorf("HF_TOKEN = %+v", env["HF_TOKEN"])
	}
}

func TestTranslateURI(t *testing.T) {
	for _, tc := range []struct {
		uri, path, rev, claim string
	}{
		{"hf://Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B", "", ""},
		{"hf://org/name@v1.2", "org/name", "v1.2", ""},
		{"pvc://models/llama/8b", "/mnt/pvc/models/llama/8b", "", "models"},
		{"pvc://models", "/mnt/pvc/models", "", "models"},
		{"pvc://models/", "/mnt/pvc/models", "", "models"},
		{"Qwen/Qwen3-8B", "Qwen/Qwen3-8B", "", ""},
		{"/data/model", "/data/model", "", ""},
		{"s3://bucket/model", "s3://bucket/model", "", ""},
	} {
		ref, err := render.TranslateURI(tc.uri)
		if err != nil || ref.Path != tc.path || ref.Revision != tc.rev || ref.Claim != tc.claim {
			t.Errorf("TranslateURI(%q) = %+v, %v; want path %q rev %q claim %q", tc.uri, ref, err, tc.path, tc.rev, tc.claim)
		}
	}
	for _, bad := range []string{"hf://noslash", "hf:///x", "hf://a/b/c", "pvc://"} {
		if _, err := render.TranslateURI(bad); err == nil {
			t.Errorf("TranslateURI(%q) accepted", bad)
		}
	}
}

func TestPVCModelIsMountedReadOnly(t *testing.T) {
	m := sample(t, "lora")
	d, c := engine(t, m)
	if c.Args[0] != "/mnt/pvc/models/llama-3.1-8b-instruct" {
		t.Errorf("model path = %q", c.Args[0])
	}
	var vol *corev1.Volume
	for i := range d.Spec.Template.Spec.Volumes {
		if v := &d.Spec.Template.Spec.Volumes[i]; v.PersistentVolumeClaim != nil {
			if vol != nil {
				t.Fatal("one claim used twice got two volumes")
			}
			vol = v
		}
	}
	if vol == nil || vol.PersistentVolumeClaim.ClaimName != "models" || !vol.PersistentVolumeClaim.ReadOnly {
		t.Fatalf("PVC volume = %+v", vol)
	}
	mounted := false
	for _, vm := range c.VolumeMounts {
		if vm.Name == vol.Name && vm.ReadOnly && vm.MountPath == "/mnt/pvc/models" {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("claim not mounted read-only at /mnt/pvc/models: %+v", c.VolumeMounts)
	}
	joined := strings.Join(c.Args, " ")
	if !strings.Contains(joined, "--enable-lora --lora-modules sql=org/llama-3-8b-sql-lora support=/mnt/pvc/models/adapters/support") {
		t.Errorf("LoRA args wrong: %s", joined)
	}
}

func TestSharedMemoryOnlyForTensorParallel(t *testing.T) {
	hasShm := func(d *appsv1.Deployment) bool {
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory {
				return true
			}
		}
		return false
	}
	if d, _ := engine(t, sample(t, "minimal")); hasShm(d) {
		t.Error("TP 1 got a /dev/shm volume")
	}
	if d, _ := engine(t, sample(t, "dp2tp2")); !hasShm(d) {
		t.Error("TP 2 has no /dev/shm volume")
	}
}

func TestUserGPURequestIsKept(t *testing.T) {
	m := sample(t, "minimal")
	m.Spec.Engine.Resources.Limits = corev1.ResourceList{render.GPUResource: resource.MustParse("2")}
	_, c := engine(t, m)
	if _, ok := c.Resources.Requests[render.GPUResource]; ok {
		t.Errorf("added a GPU request beside the user's limit: %v", c.Resources)
	}
	if q := c.Resources.Limits[render.GPUResource]; q.Value() != 2 {
		t.Errorf("user limit changed: %v", q)
	}
	if _, ok := m.Spec.Engine.Resources.Requests[render.GPUResource]; ok {
		t.Error("renderer mutated the model")
	}
}

func TestEventsOff(t *testing.T) {
	m := sample(t, "minimal")
	m.Spec.Engine.KVEvents.Enabled = ptr(false)
	d, c := engine(t, m)
	if _, ok := argValue(c.Args, "--kv-events-config"); ok {
		t.Error("--kv-events-config rendered with events off")
	}
	if len(c.Ports) != 1 {
		t.Errorf("ports with events off: %+v", c.Ports)
	}
	if _, ok := d.Spec.Template.Annotations[v1alpha1.AnnotationKVEvents]; ok {
		t.Error("kv-events-ports annotation with events off")
	}
	cfg, err := render.RouterConfig(m)
	if err != nil || cfg.Events.Enabled || cfg.Events.Replay {
		t.Errorf("router config events = %+v, %v", cfg.Events, err)
	}
}

func TestReplayOff(t *testing.T) {
	m := sample(t, "netpol") // replayBasePort: 0
	d, c := engine(t, m)
	if _, ok := d.Spec.Template.Annotations[v1alpha1.AnnotationKVReplay]; ok {
		t.Error("kv-replay-ports annotation with replay off")
	}
	raw, _ := argValue(c.Args, "--kv-events-config")
	if strings.Contains(raw, "replay_endpoint") || !strings.Contains(raw, `"endpoint":"tcp://*:6000"`) || !strings.Contains(raw, `"topic":"kvev@$(POD_IP)@qwen3-0-6b"`) {
		t.Errorf("kv-events-config = %s", raw)
	}
}

func TestResourceLabelsAndAnnotationsAreNotCopied(t *testing.T) {
	m := sample(t, "minimal")
	m.Labels = map[string]string{"argocd.argoproj.io/instance": "app", "team": "x"}
	m.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{}"}
	objs, err := render.All(m, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	y, err := render.YAML(objs)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"argocd.argoproj.io", "team:", "last-applied"} {
		if strings.Contains(string(y), s) {
			t.Errorf("the resource's own %q leaked onto a child", s)
		}
	}
}

func TestPodOverridesMergeButOurLabelsWin(t *testing.T) {
	m := sample(t, "minimal")
	m.Spec.Engine.Pod.Labels = map[string]string{"team": "a", v1alpha1.LabelComponent: "hijack"}
	m.Spec.Engine.Pod.PriorityClassName = "gpu-high"
	d, _ := engine(t, m)
	l := d.Spec.Template.Labels
	if l["team"] != "a" || l[v1alpha1.LabelComponent] != v1alpha1.ComponentEngine {
		t.Errorf("pod labels = %v", l)
	}
	if d.Spec.Template.Spec.PriorityClassName != "gpu-high" {
		t.Error("priorityClassName not merged")
	}
}

func TestOwnerReferenceWhenTheResourceHasAUID(t *testing.T) {
	m := sample(t, "minimal")
	objs, _ := render.All(m, testOpts)
	if len(objs[0].GetOwnerReferences()) != 0 {
		t.Error("owner reference without a UID")
	}
	m.UID = types.UID("1234")
	objs, err := render.All(m, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		refs := o.GetOwnerReferences()
		if len(refs) != 1 || refs[0].UID != "1234" || refs[0].Kind != "KVRoutedModel" || refs[0].Controller == nil || !*refs[0].Controller {
			t.Errorf("%s %s owner refs = %+v", o.GetObjectKind().GroupVersionKind().Kind, o.GetName(), refs)
		}
		if o.GetNamespace() != m.Namespace {
			t.Errorf("%s in namespace %q", o.GetName(), o.GetNamespace())
		}
	}
}

func TestAllIsStableAndPure(t *testing.T) {
	m := sample(t, "keda")
	before := m.DeepCopy()
	a, err := render.All(m, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := render.All(m, testOpts)
	ya, _ := render.YAML(a)
	yb, _ := render.YAML(b)
	if string(ya) != string(yb) {
		t.Error("two renders differ")
	}
	if !reflect.DeepEqual(before, m) {
		t.Error("All mutated the model")
	}
	var kinds []string
	for _, o := range a {
		if o.GetObjectKind().GroupVersionKind().Kind == "" {
			t.Errorf("%T has no TypeMeta", o)
		}
		kinds = append(kinds, o.GetObjectKind().GroupVersionKind().Kind)
	}
	want := []string{"ConfigMap", "ServiceAccount", "Role", "RoleBinding", "Service", "Deployment",
		"PodDisruptionBudget", "NetworkPolicy", "Deployment", "Service", "Service", "PodDisruptionBudget", "NetworkPolicy", "ScaledObject"}
	if !reflect.DeepEqual(kinds, want) {
		t.Errorf("order = %v, want %v", kinds, want)
	}
}

func TestUndefaultedModelIsAnError(t *testing.T) {
	m := &v1alpha1.KVRoutedModel{}
	m.Name, m.Namespace = "m", "default"
	m.Spec.Model = v1alpha1.ModelSpec{Name: "m", URI: "org/m"}
	_, err := render.All(m, testOpts)
	if err == nil || !strings.Contains(err.Error(), "not defaulted") || !strings.Contains(err.Error(), "spec.engine.port") {
		t.Fatalf("err = %v", err)
	}
}

func TestMissingImageIsAnError(t *testing.T) {
	m := sample(t, "minimal")
	if _, err := render.All(m, render.Options{DefaultRouterImage: "r"}); err == nil || !strings.Contains(err.Error(), "spec.engine.image") {
		t.Errorf("err = %v", err)
	}
	if _, err := render.All(m, render.Options{DefaultEngineImage: "e"}); err == nil || !strings.Contains(err.Error(), "spec.router.image") {
		t.Errorf("err = %v", err)
	}
}

func TestRouterConfigMapIsAValidRouterConfig(t *testing.T) {
	m := sample(t, "hpa")
	cm, err := render.RouterConfigMap(m)
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse([]byte(cm.Data[render.RouterConfigKey]))
	if err != nil {
		t.Fatalf("rendered config does not parse: %v", err)
	}
	k := c.Discovery.Kubernetes
	if k.Namespace != "llm" || k.Selector != render.EngineSelectorString(m) || k.Port != 8000 {
		t.Errorf("discovery = %+v", k)
	}
	if c.Warmup.Credit != 0.3 || c.Warmup.Duration.Duration.String() != "5m0s" || c.Policy != "kv" || c.Hash.Algo != "sha256" || c.Hash.Seed != "0" {
		t.Errorf("config = %+v", c)
	}
}

func TestConfigChangeRollsTheRouter(t *testing.T) {
	m := sample(t, "minimal")
	d1, _ := render.RouterDeployment(m, testOpts)
	m.Spec.Router.Policy = "load"
	d2, _ := render.RouterDeployment(m, testOpts)
	a1 := d1.Spec.Template.Annotations[v1alpha1.AnnotationConfigChecksum]
	a2 := d2.Spec.Template.Annotations[v1alpha1.AnnotationConfigChecksum]
	if a1 == "" || a1 == a2 {
		t.Errorf("checksum %q -> %q: a config change must change the pod template", a1, a2)
	}
}

// The router reads pods and writes its own model's status (its index report), nothing else.
func TestRouterRoleIsPodsReadOnlyAndOwnStatus(t *testing.T) {
	m := sample(t, "minimal")
	r := render.Role(m)
	if len(r.Rules) != 2 || !reflect.DeepEqual(r.Rules[0].Resources, []string{"pods"}) ||
		!reflect.DeepEqual(r.Rules[0].Verbs, []string{"get", "list", "watch"}) || !reflect.DeepEqual(r.Rules[0].APIGroups, []string{""}) {
		t.Errorf("role rules = %+v", r.Rules)
	}
	if st := r.Rules[1]; !reflect.DeepEqual(st.Resources, []string{"kvroutedmodels/status"}) || !reflect.DeepEqual(st.ResourceNames, []string{m.Name}) ||
		!reflect.DeepEqual(st.Verbs, []string{"get", "patch"}) || !reflect.DeepEqual(st.APIGroups, []string{"serving.kvroute.io"}) {
		t.Errorf("status rule = %+v", st)
	}
	rb := render.RoleBinding(sample(t, "minimal"))
	if rb.RoleRef.Name != r.Name || rb.Subjects[0].Name != render.ServiceAccount(sample(t, "minimal")).Name {
		t.Errorf("binding = %+v", rb)
	}
}

func TestPDB(t *testing.T) {
	p := render.PodDisruptionBudget(sample(t, "minimal"))
	if p.Spec.MaxUnavailable == nil || p.Spec.MaxUnavailable.IntValue() != 1 || p.Spec.MinAvailable != nil {
		t.Errorf("pdb = %+v", p.Spec)
	}
}

func TestAutoscalers(t *testing.T) {
	h := render.HorizontalPodAutoscaler(sample(t, "hpa"))
	if h.Spec.ScaleTargetRef.Kind != "KVRoutedModel" || *h.Spec.MinReplicas != 2 || h.Spec.MaxReplicas != 10 ||
		h.Spec.Behavior.ScaleDown.StabilizationWindowSeconds == nil || len(h.Spec.Metrics) != 2 {
		t.Fatalf("hpa = %+v", h.Spec)
	}
	// The routers' backlog per replica (external, selected by the PodMonitors' model label),
	// then the engines' queue per pod: the HPA takes the larger, and the queue alone while the
	// backlog is absent.
	ext, pods := h.Spec.Metrics[0].External, h.Spec.Metrics[1].Pods
	if ext == nil || ext.Metric.Name != render.BacklogMetric || ext.Metric.Selector.MatchLabels[render.ModelLabel] != "qwen-hpa" ||
		ext.Target.AverageValue.String() != "1" || pods == nil || pods.Metric.Name != render.QueueMetric || pods.Target.AverageValue.String() != "4" {
		t.Errorf("hpa metrics = %+v %+v", ext, pods)
	}
	// minReplicas 0: the HPA stays at 1 (its own zero is an alpha gate); the operator wakes a model at 0.
	z := sample(t, "hpa")
	z.Spec.Autoscaling.MinReplicas = ptr(int32(0))
	if h := render.HorizontalPodAutoscaler(z); *h.Spec.MinReplicas != 1 {
		t.Errorf("minReplicas 0 renders HPA minReplicas %d, want 1", *h.Spec.MinReplicas)
	}
	m := sample(t, "keda")
	q := resource.MustParse("500m")
	m.Spec.Autoscaling.TargetQueuePerReplica = &q
	m.Spec.Autoscaling.MinReplicas = ptr(int32(1))
	so, err := render.ScaledObject(m)
	if err != nil {
		t.Fatal(err)
	}
	if so.GetAPIVersion() != "keda.sh/v1alpha1" || so.GetKind() != "ScaledObject" {
		t.Errorf("gvk = %v", so.GroupVersionKind())
	}
	triggers := func(so map[string]interface{}) map[string]map[string]interface{} {
		out := map[string]map[string]interface{}{}
		for _, tr := range so["spec"].(map[string]interface{})["triggers"].([]interface{}) {
			tr := tr.(map[string]interface{})
			out[tr["name"].(string)] = tr["metadata"].(map[string]interface{})
		}
		return out
	}
	tr := triggers(so.Object)
	if len(tr) != 2 || tr["queue"]["threshold"] != "0.5" || tr["backlog"]["threshold"] != "1" ||
		tr["backlog"]["query"] != `max(kvroute_router_backlog_seconds{namespace="llm",model_name="qwen3-8b"})` {
		t.Errorf("triggers = %v (thresholds are floats: KEDA parses floats, not quantities)", tr)
	}
	// At minReplicas 0 the held requests activate the model.
	m.Spec.Autoscaling.MinReplicas = ptr(int32(0))
	so, _ = render.ScaledObject(m)
	if tr := triggers(so.Object); len(tr) != 3 || tr["held"]["activationThreshold"] != "0" ||
		!strings.HasPrefix(tr["held"]["query"].(string), "sum(kvroute_router_held_requests{") {
		t.Errorf("minReplicas 0 triggers = %v", tr)
	}
	// ... and the routers hold a request through the cold start, where 30s covers a restart.
	if c, _ := render.RouterConfig(m); c.Hold.MaxWait.Duration != render.ScaleFromZeroHoldWait || c.Hold.MaxWaiting != 128 {
		t.Errorf("minReplicas 0 hold = %+v", c.Hold)
	}
	m.Spec.Autoscaling.MinReplicas = ptr(int32(1))
	if c, _ := render.RouterConfig(m); c.Hold.MaxWait.Duration != 30*time.Second {
		t.Errorf("minReplicas 1 hold = %+v", c.Hold)
	}
	// A query of one's own replaces both default signals.
	m.Spec.Autoscaling.MinReplicas = ptr(int32(1))
	m.Spec.Autoscaling.KEDA.Prometheus.Query = "sum(up)"
	so, _ = render.ScaledObject(m)
	if tr := triggers(so.Object); len(tr) != 1 || tr["query"]["query"] != "sum(up)" {
		t.Errorf("custom query triggers = %v", tr)
	}
}

func ptr[T any](v T) *T { return &v }

// spec.router.timeouts reach the router's config; unset ones keep kvrouter's defaults.
func TestRouterTimeouts(t *testing.T) {
	m := sample(t, "minimal")
	d := func(s string) *metav1.Duration {
		v, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		return &metav1.Duration{Duration: v}
	}
	m.Spec.Router.Timeouts = &v1alpha1.RouterTimeouts{FirstToken: d("20m"), Idle: d("90s"), BodyRead: d("5s")}
	cfg, err := render.RouterConfig(m)
	if err != nil {
		t.Fatal(err)
	}
	l, def := cfg.Limits, config.Default().Limits
	if l.FirstTokenTimeout.Duration != 20*time.Minute || l.IdleTimeout.Duration != 90*time.Second || l.BodyReadTimeout.Duration != 5*time.Second ||
		l.ConnectTimeout != def.ConnectTimeout || l.HeaderReadTimeout != def.HeaderReadTimeout || l.RequestTimeout != def.RequestTimeout {
		t.Fatalf("limits %+v", l)
	}
}

// The router's config carries the served model name, the full report mode and where to report.
func TestRouterConfigServedModelReportModeAndReport(t *testing.T) {
	m := sample(t, "minimal")
	c, err := render.RouterConfig(m)
	if err != nil {
		t.Fatal(err)
	}
	if c.ServedModelName != m.Spec.Model.Name || c.KVCacheReportMode != "" || c.Report == nil ||
		c.Report.Namespace != m.Namespace || c.Report.KVRoutedModel != m.Name {
		t.Fatalf("config %+v", c)
	}
	m.Spec.Router.KVCacheReportMode = "full"
	if c, err = render.RouterConfig(m); err != nil || c.KVCacheReportMode != "full" {
		t.Fatalf("kvCacheReportMode %q %v", c.KVCacheReportMode, err)
	}
}

// The router learns its own pod name from the downward API: it keys the router's entry in
// status.routerReports, which the operator matches against the live router pods.
func TestRouterPodNameFromDownwardAPI(t *testing.T) {
	d, err := render.RouterDeployment(sample(t, "minimal"), testOpts)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "POD_NAME" {
			if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
				t.Fatalf("POD_NAME %+v", e)
			}
			return
		}
	}
	t.Fatal("no POD_NAME in the router container")
}

// spec.router.replicas > 1 renders the clustering; one router renders none of it, and an
// external NATS URL renders no route port or headless Service.
func TestRouterPeersRendering(t *testing.T) {
	m := sample(t, "routers3")
	svc := render.RouterPeersService(m)
	if svc == nil || svc.Spec.ClusterIP != "None" || !svc.Spec.PublishNotReadyAddresses || svc.Spec.Ports[0].Port != render.RouterPeersPort {
		t.Fatalf("headless Service: %+v", svc)
	}
	if pdb := render.RouterPodDisruptionBudget(m); pdb == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Fatalf("router PDB: %+v", pdb)
	}
	c, err := render.RouterConfig(m)
	if err != nil {
		t.Fatal(err)
	}
	if p := c.Peers; p == nil || p.ClusterListen != ":6222" || len(p.Routes) != 1 || p.Routes[0] != "qwen-routers-router-peers.llm.svc:6222" ||
		p.Subject != "kvroute.load.llm.qwen-routers" || p.TLS == nil {
		t.Fatalf("peers config: %+v", c.Peers)
	}
	d, _ := render.RouterDeployment(m, testOpts)
	env := map[string]bool{}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = true
	}
	if !env["POD_IP"] || !env["POD_NAME"] {
		t.Fatalf("router env %v: POD_IP (snapshot URL) and POD_NAME (peer id) needed", env)
	}

	m.Spec.Router.Sync.NATSURL = "tls://nats.infra:4222"
	if render.RouterPeersService(m) != nil {
		t.Fatal("headless Service rendered with an external NATS server")
	}
	if c, _ := render.RouterConfig(m); c.Peers.URL != "tls://nats.infra:4222" || c.Peers.ClusterListen != "" {
		t.Fatalf("external NATS config: %+v", c.Peers)
	}

	// Unset: two routers, clustered, a budget that keeps one, spread across nodes.
	def := sample(t, "minimal")
	if def.Spec.Router.Replicas != nil {
		t.Fatalf("minimal sample sets spec.router.replicas %d", *def.Spec.Router.Replicas)
	}
	dd, _ := render.RouterDeployment(def, testOpts)
	c2, _ := render.RouterConfig(def)
	if *dd.Spec.Replicas != 2 || render.RouterPeersService(def) == nil || c2.Peers == nil {
		t.Fatalf("default: %d routers, peers %+v", *dd.Spec.Replicas, c2.Peers)
	}
	if pdb := render.RouterPodDisruptionBudget(def); pdb == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Fatalf("default router PDB: %+v", pdb)
	}
	sp := dd.Spec.Template.Spec.TopologySpreadConstraints
	if len(sp) != 1 || sp[0].TopologyKey != corev1.LabelHostname || sp[0].MaxSkew != 1 ||
		sp[0].WhenUnsatisfiable != corev1.ScheduleAnyway || !reflect.DeepEqual(sp[0].LabelSelector.MatchLabels, render.RouterSelector(def)) {
		t.Fatalf("router spread: %+v", sp)
	}

	// One router, asked for: none of it.
	one := sample(t, "minimal")
	one.Spec.Router.Replicas = ptr(int32(1))
	d1, _ := render.RouterDeployment(one, testOpts)
	if render.RouterPeersService(one) != nil || render.RouterPodDisruptionBudget(one) != nil || *d1.Spec.Replicas != 1 ||
		d1.Spec.Template.Spec.TopologySpreadConstraints != nil {
		t.Fatal("clustering rendered for one router")
	}
	if c, _ := render.RouterConfig(one); c.Peers != nil {
		t.Fatalf("peers config for one router: %+v", c.Peers)
	}
	// EnginesConnect, unset: one router (each engine sends its events to one).
	ec := sample(t, "minimal")
	ec.Spec.Engine.KVEvents.Mode = v1alpha1.EventsEnginesConnect
	if render.RouterReplicas(ec) != 1 || render.RouterPodDisruptionBudget(ec) != nil {
		t.Fatalf("EnginesConnect default: %d routers", render.RouterReplicas(ec))
	}
}

// Capture on a claim: the claim is mounted at the capture directory and the pod's fsGroup makes
// it writable; the router config points the capture there. Off, neither appears.
func TestRouterCaptureOnAClaim(t *testing.T) {
	m := sample(t, "trial")
	m.Spec.Router.Capture.ClaimName = "traces"
	d, err := render.RouterDeployment(m, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	pod := d.Spec.Template.Spec
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	if v := vols["capture"]; v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != "traces" {
		t.Fatalf("capture volume %+v", v)
	}
	if pod.SecurityContext.FSGroup == nil || *pod.SecurityContext.FSGroup != 65532 {
		t.Fatalf("fsGroup %v", pod.SecurityContext.FSGroup)
	}
	c, err := render.RouterConfig(m)
	if err != nil || c.Capture == nil || c.Capture.Dir != render.RouterCaptureDir || c.Audit == nil || c.Audit.SampleEvery != 8 {
		t.Fatalf("%+v %v", c.Capture, err)
	}
	off := sample(t, "minimal")
	d, _ = render.RouterDeployment(off, testOpts)
	c, _ = render.RouterConfig(off)
	if len(d.Spec.Template.Spec.Volumes) != 1 || c.Capture != nil || c.Audit != nil {
		t.Fatalf("capture or audit rendered while off: %v %+v %+v", d.Spec.Template.Spec.Volumes, c.Capture, c.Audit)
	}
}
