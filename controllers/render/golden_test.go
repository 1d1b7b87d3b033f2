package render_test

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/api/v1alpha1/validation"
	"github.com/kvroute/kvroute/controllers/render"
)

var update = flag.Bool("update", false, "rewrite testdata/render/*.yaml from the current renderers")

const (
	samplesDir = "../../config/samples"
	goldenDir  = "../../testdata/render"
)

var testOpts = render.Options{DefaultEngineImage: "vllm/vllm-openai:test", DefaultRouterImage: "kvroute/kvrouter:test"}

// sample admits config/samples/serving_v1alpha1_kvroutedmodel_<shape>.yaml through the CRD.
func sample(t testing.TB, shape string) *v1alpha1.KVRoutedModel {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(samplesDir, "serving_v1alpha1_kvroutedmodel_"+shape+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := validation.New()
	if err != nil {
		t.Fatal(err)
	}
	m, err := v.Admit(context.Background(), b, "default")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

var shapes = []string{"minimal", "dp2tp2", "keda", "hpa", "lora", "netpol", "apikey", "bound", "trial", "routers3", "production", "cache-rwo", "sim", "pd", "sglang", "trtllm", "endpointpicker"}

// TestGolden renders every sample (each output holds every renderer's object for that shape)
// and compares with testdata/render/<shape>.yaml; -update rewrites them.
func TestGolden(t *testing.T) {
	for _, shape := range shapes {
		t.Run(shape, func(t *testing.T) {
			objs, err := render.All(sample(t, shape), testOpts)
			if err != nil {
				t.Fatal(err)
			}
			got, err := render.YAML(objs)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(goldenDir, shape+".yaml")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./controllers/render -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from the rendered output; review and run with -update:\n%s", path, diffLines(string(want), string(got)))
			}
		})
	}
}

func TestGoldenCoversEveryKind(t *testing.T) {
	seen := map[string]bool{}
	for _, shape := range shapes {
		objs, err := render.All(sample(t, shape), testOpts)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			seen[o.GetObjectKind().GroupVersionKind().Kind] = true
		}
	}
	for _, k := range []string{"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "ConfigMap",
		"NetworkPolicy", "PodDisruptionBudget", "HorizontalPodAutoscaler", "ScaledObject", "PersistentVolumeClaim", "InferencePool"} {
		if !seen[k] {
			t.Errorf("no sample renders a %s", k)
		}
	}
}

// diffLines shows the first differing lines, enough to see what changed.
func diffLines(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	shown := 0
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			b.WriteString("line " + strconv.Itoa(i+1) + ":\n- " + wl + "\n+ " + gl + "\n")
			if shown++; shown == 10 {
				break
			}
		}
	}
	return b.String()
}
