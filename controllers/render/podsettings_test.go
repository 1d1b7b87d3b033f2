package render_test

import (
	"encoding/json"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/internal/vllmrelease"
)

func mountAt(c corev1.Container, path string) (corev1.VolumeMount, bool) {
	for _, vm := range c.VolumeMounts {
		if vm.MountPath == path {
			return vm, true
		}
	}
	return corev1.VolumeMount{}, false
}

func envValue(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

func TestProductionPodSettingsAreRendered(t *testing.T) {
	d, c := engine(t, sample(t, "production"))
	ps := d.Spec.Template.Spec
	if len(ps.ImagePullSecrets) != 1 || ps.ImagePullSecrets[0].Name != "regcred" {
		t.Errorf("imagePullSecrets = %v", ps.ImagePullSecrets)
	}
	if ps.ServiceAccountName != "llama-engine" || ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Errorf("serviceAccountName %q, automount %v: the token must stay unmounted", ps.ServiceAccountName, ps.AutomountServiceAccountToken)
	}
	if vm, ok := mountAt(c, "/etc/chat-template"); !ok || vm.Name != "chat-template" || !vm.ReadOnly {
		t.Errorf("chat template mount = %+v (found %v)", vm, ok)
	}
	var cm *corev1.ConfigMapVolumeSource
	for _, v := range ps.Volumes {
		if v.Name == "chat-template" {
			cm = v.ConfigMap
		}
	}
	if cm == nil || cm.Name != "llama-chat-template" {
		t.Errorf("chat-template volume = %+v", cm)
	}
	if len(c.EnvFrom) != 1 || c.EnvFrom[0].SecretRef == nil || c.EnvFrom[0].SecretRef.Name != "llama-engine-env" {
		t.Errorf("envFrom = %+v", c.EnvFrom)
	}
	if len(ps.TopologySpreadConstraints) != 1 {
		t.Fatalf("topologySpreadConstraints = %+v", ps.TopologySpreadConstraints)
	}
	tsc := ps.TopologySpreadConstraints[0]
	sel := render.EngineSelector(sample(t, "production"))
	if tsc.TopologyKey != "topology.kubernetes.io/zone" || tsc.MaxSkew != 1 || tsc.WhenUnsatisfiable != corev1.ScheduleAnyway ||
		tsc.LabelSelector == nil || len(tsc.LabelSelector.MatchLabels) != len(sel) || !slices.Equal(tsc.MatchLabelKeys, []string{appsv1.DefaultDeploymentUniqueLabelKey}) {
		t.Errorf("spread constraint = %+v", tsc)
	}
	for k, v := range sel {
		if tsc.LabelSelector.MatchLabels[k] != v {
			t.Errorf("spread selector %v does not select the engine pods (%v)", tsc.LabelSelector.MatchLabels, sel)
		}
	}
	// Overridden fields take the user's value; the rest keep the operator's.
	sc := ps.SecurityContext
	if *sc.FSGroup != 2000 || *sc.RunAsUser != 1000 || !*sc.RunAsNonRoot || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context = %+v", sc)
	}
	csc := c.SecurityContext
	if csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem || *csc.AllowPrivilegeEscalation || !slices.Equal(csc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container security context = %+v", csc)
	}
}

func TestContainerCapabilityAddKeepsAllDropped(t *testing.T) {
	m := sample(t, "minimal")
	m.Spec.Engine.Pod.ContainerSecurityContext = &v1alpha1.ContainerSecurityOverrides{
		Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE"}},
	}
	_, c := engine(t, m)
	caps := c.SecurityContext.Capabilities
	if !slices.Equal(caps.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(caps.Add, []corev1.Capability{"NET_BIND_SERVICE"}) {
		t.Errorf("capabilities = %+v", caps)
	}
	// The model's own object is not changed by rendering.
	if m.Spec.Engine.Pod.ContainerSecurityContext.Capabilities.Drop != nil {
		t.Error("rendering wrote into the model")
	}
}

func TestUserVolumesComeAfterTheOperatorsAndKeepTheirSource(t *testing.T) {
	m := sample(t, "minimal")
	m.Spec.Engine.Pod.Volumes = []v1alpha1.EngineVolume{
		{Name: "creds", Secret: &v1alpha1.SecretVolume{SecretName: "s3", DefaultMode: ptr(int32(0o400))}},
		{Name: "store", CSI: &v1alpha1.CSIVolume{Driver: "secrets-store.csi.k8s.io", ReadOnly: ptr(true), VolumeAttributes: map[string]string{"secretProviderClass": "vault"}}},
		{Name: "data", PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "datasets", ReadOnly: true}},
	}
	m.Spec.Engine.Pod.VolumeMounts = []v1alpha1.EngineVolumeMount{{Name: "creds", MountPath: "/var/run/creds", ReadOnly: true}, {Name: "data", MountPath: "/data", SubPath: "eval"}}
	d, c := engine(t, m)
	vols := d.Spec.Template.Spec.Volumes
	if vols[0].Name != "home" || len(vols) != 4 {
		t.Fatalf("volumes = %+v", vols)
	}
	if s := vols[1].Secret; s == nil || s.SecretName != "s3" || *s.DefaultMode != 0o400 || vols[1].CSI != nil {
		t.Errorf("secret volume = %+v", vols[1])
	}
	if s := vols[2].CSI; s == nil || s.Driver != "secrets-store.csi.k8s.io" || s.VolumeAttributes["secretProviderClass"] != "vault" {
		t.Errorf("csi volume = %+v", vols[2])
	}
	if vm, ok := mountAt(c, "/data"); !ok || vm.SubPath != "eval" || vm.Name != "data" {
		t.Errorf("data mount = %+v", vm)
	}
}

func TestModelCacheOnAnExistingClaim(t *testing.T) {
	m := sample(t, "minimal")
	m.Spec.Model.Cache = &v1alpha1.ModelCacheSpec{ClaimName: "weights", AccessMode: corev1.ReadWriteMany, OnDelete: v1alpha1.CacheRetain}
	d, c := engine(t, m)
	if v, _ := envValue(c, "HF_HOME"); v != render.ModelCacheMountPath {
		t.Errorf("HF_HOME = %q", v)
	}
	if vm, ok := mountAt(c, render.ModelCacheMountPath); !ok || vm.ReadOnly {
		t.Errorf("cache mount = %+v (found %v): it must be writable", vm, ok)
	}
	var claim string
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == render.ModelCacheVolume {
			claim = v.PersistentVolumeClaim.ClaimName
		}
	}
	if claim != "weights" {
		t.Errorf("cache volume claim = %q", claim)
	}
	// ReadWriteMany: the usual surge rollout.
	if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType {
		t.Errorf("strategy = %+v", d.Spec.Strategy)
	}
	if render.ModelCachePVC(m) != nil {
		t.Error("a PVC rendered for an existing claim")
	}
	// Without a cache there is no HF_HOME: the Hugging Face default under HOME.
	_, c = engine(t, sample(t, "minimal"))
	if _, ok := envValue(c, "HF_HOME"); ok {
		t.Error("HF_HOME without a cache")
	}
}

func TestManagedModelCacheClaim(t *testing.T) {
	m := sample(t, "cache-rwo")
	m.UID = types.UID("1234")
	pvc := render.ModelCachePVC(m)
	if pvc == nil || pvc.Name != "qwen-cached-model-cache" || pvc.Namespace != "llm" {
		t.Fatalf("pvc = %+v", pvc)
	}
	if !slices.Equal(pvc.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}) ||
		!pvc.Spec.Resources.Requests.Storage().Equal(resource.MustParse("20Gi")) || pvc.Spec.StorageClassName != nil {
		t.Errorf("pvc spec = %+v", pvc.Spec)
	}
	// onDelete: Delete -> owned by the model, so garbage collection removes it.
	if refs := pvc.OwnerReferences; len(refs) != 1 || refs[0].UID != "1234" {
		t.Errorf("owner references with onDelete Delete = %+v", refs)
	}
	m.Spec.Model.Cache.OnDelete = v1alpha1.CacheRetain
	if refs := render.ModelCachePVC(m).OwnerReferences; len(refs) != 0 {
		t.Errorf("owner references with onDelete Retain = %+v: the claim must outlive the model", refs)
	}
	// ReadWriteOnce: the old pod must let go of the claim before the new one mounts it.
	d, _ := engine(t, m)
	if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType || d.Spec.Strategy.RollingUpdate != nil {
		t.Errorf("strategy with a ReadWriteOnce cache = %+v", d.Spec.Strategy)
	}
	// All renders the claim before the Deployment that mounts it.
	objs, err := render.All(m, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	pvcAt, depAt := -1, -1
	for i, o := range objs {
		switch o.(type) {
		case *corev1.PersistentVolumeClaim:
			pvcAt = i
		case *appsv1.Deployment:
			if depAt < 0 {
				depAt = i
			}
		}
	}
	if pvcAt < 0 || pvcAt > depAt {
		t.Errorf("claim at %d, engine Deployment at %d", pvcAt, depAt)
	}
}

func TestKVEventsEndpointBinds(t *testing.T) {
	// vLLM binds a wildcard PUB endpoint and connects to any other (vllmrelease.BindsEndpoint,
	// the rule vllm-sim's `vllm serve` follows too), so the endpoint the engines publish on must
	// bind; only EnginesConnect dials out, on purpose.
	for _, shape := range shapes {
		m := sample(t, shape)
		if !*m.Spec.Engine.KVEvents.Enabled {
			continue
		}
		cfg, err := render.KVEventsConfigJSON(m)
		if err != nil {
			t.Fatal(err)
		}
		var kc struct {
			Endpoint string `json:"endpoint"`
		}
		if err := json.Unmarshal([]byte(cfg), &kc); err != nil {
			t.Fatal(err)
		}
		binds := vllmrelease.BindsEndpoint(kc.Endpoint)
		if binds == render.EnginesConnect(m) {
			t.Errorf("%s: endpoint binds=%v with EnginesConnect=%v: %s", shape, binds, render.EnginesConnect(m), cfg)
		}
	}
}
