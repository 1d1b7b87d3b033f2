package validation_test

import (
	"context"
	"os"
	"strings"
	"testing"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/api/v1alpha1/validation/validationtest"
	"github.com/kvroute/kvroute/test/envtestenv"
)

// TestAgainstKubeAPIServer installs the generated CRD into a real kube-apiserver and checks
// that (1) it rejects every case of the shared table with exactly the offline message, and
// (2) it accepts every sample and defaults it exactly as the offline validator does.
func TestAgainstKubeAPIServer(t *testing.T) {
	env, cfg, err := envtestenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
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
	v := newValidator(t)

	cases, err := validationtest.Load(casesFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("invalid", func(t *testing.T) {
		for i, tc := range cases {
			t.Run(tc.Name, func(t *testing.T) {
				u := &unstructured.Unstructured{Object: tc.Object(i)}
				u.SetNamespace("default")
				serverErr := c.Create(ctx, u, client.FieldValidation("Strict"))
				if serverErr == nil {
					t.Fatalf("kube-apiserver accepted:\n%s", tc.YAML(i))
				}
				_, offlineErr := v.Admit(ctx, tc.YAML(i), "default")
				if offlineErr == nil {
					t.Fatalf("offline validator accepted what the server refused: %v", serverErr)
				}
				if serverErr.Error() != offlineErr.Error() {
					t.Errorf("messages differ\nserver:  %v\noffline: %v", serverErr, offlineErr)
				}
				if !strings.Contains(serverErr.Error(), tc.Field) {
					t.Errorf("server message does not name %s: %v", tc.Field, serverErr)
				}
			})
		}
	})

	t.Run("samples", func(t *testing.T) {
		for _, f := range samples(t) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal(b, &u.Object); err != nil {
				t.Fatal(err)
			}
			ns := u.GetNamespace()
			if err := c.Create(ctx, namespace(ns)); err != nil && !strings.Contains(err.Error(), "already exists") {
				t.Fatal(err)
			}
			if err := c.Create(ctx, u, client.FieldValidation("Strict")); err != nil {
				t.Errorf("%s refused: %v", f, err)
				continue
			}
			var got v1alpha1.KVRoutedModel
			if err := c.Get(ctx, client.ObjectKeyFromObject(u), &got); err != nil {
				t.Fatal(err)
			}
			want, err := v.Admit(ctx, b, "default")
			if err != nil {
				t.Fatal(err)
			}
			if !apiequality.Semantic.DeepEqual(got.Spec, want.Spec) {
				gy, _ := yaml.Marshal(got.Spec)
				wy, _ := yaml.Marshal(want.Spec)
				t.Errorf("%s: server and offline defaults differ\nserver:\n%s\noffline:\n%s", f, gy, wy)
			}
		}
	})
}

func namespace(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("v1")
	u.SetKind("Namespace")
	u.SetName(name)
	return u
}
