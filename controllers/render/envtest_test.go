package render_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/api/v1alpha1/validation"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/test/envtestenv"
)

// TestChildrenApplyToKubeAPIServer creates each sample in a real kube-apiserver, renders its
// children from the object the server returns (server defaults, real UID), and applies them
// with server-side apply, as the reconciler will. The server's own validation of Deployments,
// NetworkPolicies, PDBs, HPAs... is the check; KEDA is not installed, so its ScaledObject must
// fail with a no-match error (what the reconciler turns into Degraded/KEDANotInstalled). The
// InferencePool's is the test fixture of its documented API (testdata/crds), so the rendered pool
// meets its bounds and CEL rule.
func TestChildrenApplyToKubeAPIServer(t *testing.T) {
	env, cfg, err := envtestenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{ErrorIfPathMissing: true,
		Paths: []string{filepath.Join("..", "..", "testdata", "crds", "inference.networking.k8s.io_inferencepools.yaml")}}); err != nil {
		t.Fatal(err)
	}
	s := runtime.NewScheme()
	if err := scheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := &unstructured.Unstructured{}
	ns.SetAPIVersion("v1")
	ns.SetKind("Namespace")
	ns.SetName("llm")
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	for _, shape := range shapes {
		t.Run(shape, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(samplesDir, "serving_v1alpha1_kvroutedmodel_"+shape+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			var m v1alpha1.KVRoutedModel
			if err := yaml.UnmarshalStrict(b, &m); err != nil {
				t.Fatal(err)
			}
			if err := c.Create(ctx, &m); err != nil {
				t.Fatalf("create: %v", err)
			}
			objs, err := render.All(&m, testOpts)
			if err != nil {
				t.Fatalf("render from the server's object: %v", err)
			}
			for _, o := range objs {
				content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
				if err != nil {
					t.Fatal(err)
				}
				u := &unstructured.Unstructured{Object: content}
				kind := u.GetKind()
				err = c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("kvroute-render-test"), client.ForceOwnership)
				if kind == "ScaledObject" {
					if !meta.IsNoMatchError(err) {
						t.Errorf("ScaledObject without KEDA: err = %v, want a no-match error", err)
					}
					continue
				}
				if err != nil {
					t.Errorf("apply %s %s: %v", kind, u.GetName(), err)
					continue
				}
				refs := u.GetOwnerReferences()
				if kind == "PersistentVolumeClaim" && m.Spec.Model.Cache.OnDelete == v1alpha1.CacheRetain {
					// A retained model cache outlives the model: no owner on purpose.
					if len(refs) != 0 {
						t.Errorf("retained %s %s owned: %v", kind, u.GetName(), refs)
					}
					continue
				}
				if len(refs) != 1 || refs[0].UID != m.UID {
					t.Errorf("%s %s not owned by the resource: %v", kind, u.GetName(), refs)
				}
			}
			// The server's defaulting and the offline validator's agree on what renders.
			v, err := validation.New()
			if err != nil {
				t.Fatal(err)
			}
			offline, err := v.Admit(ctx, b, "default")
			if err != nil {
				t.Fatal(err)
			}
			offline.UID = m.UID
			a, _ := render.All(offline, testOpts)
			ya, _ := render.YAML(a)
			yb, _ := render.YAML(objs)
			if string(ya) != string(yb) {
				t.Errorf("rendering the server's object and the offline-admitted one differ")
			}
			if !strings.Contains(string(yb), "uid: "+string(m.UID)) {
				t.Error("owner UID missing from rendered YAML")
			}
		})
	}
}
