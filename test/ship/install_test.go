package ship

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
)

const (
	managerNamespace = "kvroute-system"
	managerSA        = "kvroute-controller-manager"
	fieldManager     = "kvroute-ship-test"
)

func decodeObjects(t *testing.T, b []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatal(err)
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

func TestInstallYAMLIsCurrent(t *testing.T) {
	want := kustomizeBuild(t, "config/default")
	got := readFile(t, "dist/install.yaml")
	if !bytes.Equal(got, want) {
		t.Fatalf("dist/install.yaml differs from kustomize build config/default (%d vs %d bytes): run `make build-installer`", len(got), len(want))
	}
}

func TestInstallManagerDeploymentIsRestricted(t *testing.T) {
	var dep *unstructured.Unstructured
	for _, o := range decodeObjects(t, readFile(t, "dist/install.yaml")) {
		if o.GetKind() == "Deployment" {
			dep = o
		}
		if o.GetNamespace() != "" && o.GetNamespace() != managerNamespace {
			t.Errorf("%s %s is in namespace %s, not %s", o.GetKind(), o.GetName(), o.GetNamespace(), managerNamespace)
		}
	}
	if dep == nil {
		t.Fatal("no Deployment in dist/install.yaml")
	}
	pod, _, _ := unstructured.NestedMap(dep.Object, "spec", "template", "spec")
	check := func(what string, ok bool) {
		if !ok {
			t.Errorf("manager Deployment: %s", what)
		}
	}
	nonRoot, _, _ := unstructured.NestedBool(pod, "securityContext", "runAsNonRoot")
	check("pod runAsNonRoot must be true", nonRoot)
	seccomp, _, _ := unstructured.NestedString(pod, "securityContext", "seccompProfile", "type")
	check("seccompProfile must be RuntimeDefault", seccomp == "RuntimeDefault")
	containers, _, _ := unstructured.NestedSlice(pod, "containers")
	if len(containers) != 1 {
		t.Fatalf("want one container, got %d", len(containers))
	}
	c := containers[0].(map[string]any)
	ro, _, _ := unstructured.NestedBool(c, "securityContext", "readOnlyRootFilesystem")
	check("readOnlyRootFilesystem must be true", ro)
	esc, found, _ := unstructured.NestedBool(c, "securityContext", "allowPrivilegeEscalation")
	check("allowPrivilegeEscalation must be false", found && !esc)
	drop, _, _ := unstructured.NestedStringSlice(c, "securityContext", "capabilities", "drop")
	check("capabilities must drop ALL", slices.Equal(drop, []string{"ALL"}))
	for _, p := range []string{"livenessProbe", "readinessProbe"} {
		_, ok, _ := unstructured.NestedMap(c, p, "httpGet")
		check(p+" must be an HTTP probe", ok)
	}
	for _, r := range []string{"cpu", "memory"} {
		_, ok, _ := unstructured.NestedString(c, "resources", "requests", r)
		check("must request "+r, ok)
	}
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	check("must run with --leader-elect", slices.Contains(args, "--leader-elect"))
	img, _, _ := unstructured.NestedString(c, "image")
	check("image must be ghcr.io/kvroute/manager:<tag>, got "+img, strings.HasPrefix(img, "ghcr.io/kvroute/manager:v"))
}

// TestInstallAppliesAndRBACFits applies every object of dist/install.yaml to the API server
// with server-side apply, then asks the API server (SubjectAccessReview, the RBAC authorizer)
// whether the manager's ServiceAccount may do exactly what the controller does: apply and
// delete every kind of child the renderers produce for the samples, read and patch pods, write
// the model's status, events and its lease; and that it may not read secrets or delete pods.
func TestInstallAppliesAndRBACFits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dyn := dynamic.NewForConfigOrDie(restCfg)
	cs := kubernetes.NewForConfigOrDie(restCfg)
	mapper := newMapper()

	objs := decodeObjects(t, readFile(t, "dist/install.yaml"))
	// CRDs and the Namespace first, as kubectl does with its own ordering.
	sort.SliceStable(objs, func(i, j int) bool { return applyRank(objs[i]) < applyRank(objs[j]) })
	var clusterRole *rbacv1.ClusterRole
	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" {
			apply(ctx, t, dyn, mapper, o)
			waitEstablished(ctx, t, dyn, o.GetName())
			mapper.Reset()
			continue
		}
		apply(ctx, t, dyn, mapper, o)
		if o.GetKind() == "ClusterRole" {
			clusterRole = &rbacv1.ClusterRole{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, clusterRole); err != nil {
				t.Fatal(err)
			}
		}
	}
	if clusterRole == nil {
		t.Fatal("dist/install.yaml has no ClusterRole")
	}

	// What the controller does, from its renderers over every sample (created on the API
	// server, so the schema defaults are filled in as the controller sees them).
	children := map[schema.GroupResource]bool{}
	for _, m := range createSamples(ctx, t, dyn, cs) {
		rendered, err := render.All(m, render.Options{DefaultEngineImage: "e:1", DefaultRouterImage: "r:1"})
		if err != nil {
			t.Fatalf("render %s: %v", m.Name, err)
		}
		for _, o := range rendered {
			gvk := o.GetObjectKind().GroupVersionKind()
			gr, err := groupResource(mapper, gvk)
			if err != nil {
				t.Fatal(err)
			}
			children[gr] = true
			// The operator grants the router's Role; RBAC forbids granting what it lacks.
			if r, ok := o.(*rbacv1.Role); ok {
				for _, rule := range r.Rules {
					for _, res := range rule.Resources {
						for _, v := range rule.Verbs {
							mustAllow(ctx, t, cs, "llm", rule.APIGroups[0], res, v, "the router Role it grants")
						}
					}
				}
			}
		}
	}
	if len(children) < 8 {
		t.Fatalf("the samples render only %d kinds of children: %v", len(children), children)
	}
	applyVerbs := []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	needs := map[schema.GroupResource][]string{
		{Group: v1alpha1.GroupVersion.Group, Resource: "kvroutedmodels"}:        {"get", "list", "watch"},
		{Group: v1alpha1.GroupVersion.Group, Resource: "kvroutedmodels/status"}: {"get", "update", "patch"},
		// The wake from zero writes the model's own /scale (controllers/wake.go).
		{Group: v1alpha1.GroupVersion.Group, Resource: "kvroutedmodels/scale"}: {"update"},
		{Group: "", Resource: "pods"}:                                          {"get", "list", "watch", "patch"},
		{Group: "events.k8s.io", Resource: "events"}:                           {"create", "patch"},
		{Group: "coordination.k8s.io", Resource: "leases"}:                     {"get", "create", "update"},
		{Group: "apiregistration.k8s.io", Resource: "apiservices"}:             {"get", "list"},
	}
	for gr := range children {
		needs[gr] = applyVerbs
	}
	for gr, verbs := range needs {
		for _, v := range verbs {
			mustAllow(ctx, t, cs, "llm", gr.Group, gr.Resource, v, "what the controller does")
		}
	}
	// Nothing more than that.
	for _, denied := range []struct{ group, resource, verb string }{
		{"", "secrets", "get"}, {"", "secrets", "create"}, {"", "pods", "delete"}, {"", "pods", "create"},
		{"", "nodes", "get"}, {v1alpha1.GroupVersion.Group, "kvroutedmodels", "update"},
		{"apiextensions.k8s.io", "customresourcedefinitions", "create"}, {"rbac.authorization.k8s.io", "clusterroles", "create"},
	} {
		if allowed(ctx, t, cs, "llm", denied.group, denied.resource, denied.verb) {
			t.Errorf("the manager may %s %s.%s; it should not", denied.verb, denied.resource, denied.group)
		}
	}
	for _, rule := range clusterRole.Rules {
		for _, g := range rule.APIGroups {
			for _, r := range rule.Resources {
				if g == "*" || r == "*" || slices.Contains(rule.Verbs, "*") {
					t.Errorf("wildcard in the manager's ClusterRole: %+v", rule)
				}
				gr := schema.GroupResource{Group: g, Resource: r}
				want, ok := needs[gr]
				if !ok {
					t.Errorf("ClusterRole grants %s, which the controller neither applies nor reads", gr)
					continue
				}
				for _, v := range rule.Verbs {
					if !slices.Contains(want, v) && !(gr.Resource == "leases" && slices.Contains(applyVerbs, v)) {
						t.Errorf("ClusterRole grants %s on %s, which the controller does not do", v, gr)
					}
				}
			}
		}
	}
}

func newMapper() *restmapper.DeferredDiscoveryRESTMapper {
	return restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(restCfg)))
}

func applyRank(o *unstructured.Unstructured) int {
	switch o.GetKind() {
	case "CustomResourceDefinition":
		return 0
	case "Namespace":
		return 1
	case "ServiceAccount", "ClusterRole", "Role":
		return 2
	}
	return 3
}

func groupResource(mapper *restmapper.DeferredDiscoveryRESTMapper, gvk schema.GroupVersionKind) (schema.GroupResource, error) {
	if gvk.Group == "keda.sh" || gvk.Group == "inference.networking.k8s.io" {
		// Neither KEDA's nor the Inference Extension's CRD is installed here; their plurals are fixed.
		return schema.GroupResource{Group: gvk.Group, Resource: strings.ToLower(gvk.Kind) + "s"}, nil
	}
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return schema.GroupResource{}, fmt.Errorf("map %s: %w", gvk, err)
	}
	return m.Resource.GroupResource(), nil
}

func apply(ctx context.Context, t *testing.T, dyn dynamic.Interface, mapper *restmapper.DeferredDiscoveryRESTMapper, o *unstructured.Unstructured) {
	t.Helper()
	gvk := o.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("map %s: %v", gvk, err)
	}
	var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if o.GetNamespace() != "" {
		ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	}
	if _, err := ri.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: fieldManager, Force: true}); err != nil {
		t.Fatalf("server-side apply %s %s: %v", o.GetKind(), o.GetName(), err)
	}
}

func waitEstablished(ctx context.Context, t *testing.T, dyn dynamic.Interface, name string) {
	t.Helper()
	crds := dyn.Resource(apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions"))
	for {
		u, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				cm, _ := c.(map[string]any)
				if cm["type"] == "Established" && cm["status"] == "True" {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("CRD %s not Established: %v", name, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

var modelGVR = v1alpha1.GroupVersion.WithResource("kvroutedmodels")

// createSamples creates every sample (from config/samples) and returns them as read back.
func createSamples(ctx context.Context, t *testing.T, dyn dynamic.Interface, cs kubernetes.Interface) []*v1alpha1.KVRoutedModel {
	t.Helper()
	var out []*v1alpha1.KVRoutedModel
	for _, s := range decodeObjects(t, kustomizeBuild(t, "config/samples")) {
		ensureNamespace(ctx, t, cs, s.GetNamespace())
		if _, err := dyn.Resource(modelGVR).Namespace(s.GetNamespace()).Apply(ctx, s.GetName(), s, metav1.ApplyOptions{FieldManager: fieldManager, Force: true}); err != nil {
			t.Fatalf("apply sample %s: %v", s.GetName(), err)
		}
		got, err := dyn.Resource(modelGVR).Namespace(s.GetNamespace()).Get(ctx, s.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m := &v1alpha1.KVRoutedModel{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		t.Fatal("no samples in config/samples")
	}
	return out
}

func ensureNamespace(ctx context.Context, t *testing.T, cs kubernetes.Interface, name string) {
	t.Helper()
	if _, err := cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{}); err == nil {
		return
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
}

func allowed(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, group, resource, verb string) bool {
	t.Helper()
	res, sub, _ := strings.Cut(resource, "/")
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User:   "system:serviceaccount:" + managerNamespace + ":" + managerSA,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + managerNamespace, "system:authenticated"},
		ResourceAttributes: &authzv1.ResourceAttributes{
			Namespace: ns, Verb: verb, Group: group, Resource: res, Subresource: sub,
		},
	}}
	got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SubjectAccessReview: %v", err)
	}
	return got.Status.Allowed
}

func mustAllow(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, group, resource, verb, why string) {
	t.Helper()
	if !allowed(ctx, t, cs, ns, group, resource, verb) {
		t.Errorf("the manager may not %s %s.%s in %s (%s)", verb, resource, group, ns, why)
	}
}
