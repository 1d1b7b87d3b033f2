package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/kvroute/kvroute/api/v1alpha1/validation"
	"github.com/kvroute/kvroute/api/v1alpha1/validation/validationtest"
)

func renderCLI(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(append([]string{"render"}, args...), strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func docs(t *testing.T, s string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(s), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := d.Decode(&u.Object); err != nil {
			break
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
	return objs
}

func TestRenderDP2SampleShowsPortsPerRank(t *testing.T) {
	code, out, stderr := renderCLI(t, "", "-f", "../../config/samples/serving_v1alpha1_kvroutedmodel_dp2tp2.yaml")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	objs := docs(t, out)
	if len(objs) != 13 { // with the engine and router NetworkPolicies, the two routers' PDB and peers Service
		t.Fatalf("want 13 children, got %d", len(objs))
	}
	var engine *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Deployment" && o.GetName() == "llama-70b-engine" {
			engine = o
		}
	}
	if engine == nil {
		t.Fatal("no engine Deployment")
	}
	containers, _, _ := unstructured.NestedSlice(engine.Object, "spec", "template", "spec", "containers")
	ports := containers[0].(map[string]interface{})["ports"].([]interface{})
	names := map[string]float64{}
	for _, p := range ports {
		pm := p.(map[string]interface{})
		names[pm["name"].(string)], _ = pm["containerPort"].(float64) // YAML decodes numbers as float64
	}
	for name, want := range map[string]float64{"kv-events-0": 5557, "kv-events-1": 5558, "kv-replay-0": 5600, "kv-replay-1": 5601} {
		if names[name] != want {
			t.Errorf("port %s = %v, want %v (all: %v)", name, names[name], want, names)
		}
	}
}

func TestRenderStdinMultipleDocumentsAndNamespace(t *testing.T) {
	in := `# two models
apiVersion: serving.kvroute.io/v1alpha1
kind: KVRoutedModel
metadata: {name: a}
spec: {model: {name: a, uri: org/a}}
---
# a comment-only document is skipped
---
apiVersion: serving.kvroute.io/v1alpha1
kind: KVRoutedModel
metadata: {name: b, namespace: other}
spec: {model: {name: b, uri: org/b}, networkPolicy: {enabled: false}}
`
	code, out, stderr := renderCLI(t, in, "-f", "-", "-n", "team", "--engine-image", "e:1", "--router-image", "r:1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	objs := docs(t, out)
	if len(objs) != 24 { // 13 for a, 11 for b (no NetworkPolicies); each with two routers
		t.Fatalf("want 24 objects, got %d", len(objs))
	}
	if objs[0].GetNamespace() != "team" || objs[len(objs)-1].GetNamespace() != "other" {
		t.Errorf("namespaces %q / %q", objs[0].GetNamespace(), objs[len(objs)-1].GetNamespace())
	}
	if !strings.Contains(out, "image: e:1") || !strings.Contains(out, "image: r:1") {
		t.Error("image flags not used")
	}
}

// TestRenderRejectsTheInvalidTable: exit 1 and the validator's (= the apiserver's, see the
// envtest test in api/v1alpha1/validation) message naming the field.
func TestRenderRejectsTheInvalidTable(t *testing.T) {
	cases, err := validationtest.Load("../../testdata/render/invalid-cases.yaml")
	if err != nil {
		t.Fatal(err)
	}
	v, err := validation.New()
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			code, out, stderr := renderCLI(t, string(tc.YAML(i)), "-f", "-")
			if code != 1 || out != "" {
				t.Fatalf("exit %d, stdout %q", code, out)
			}
			_, want := v.Admit(context.Background(), tc.YAML(i), "default")
			if want == nil || !strings.Contains(stderr, want.Error()) || !strings.Contains(stderr, tc.Field) {
				t.Errorf("stderr %q does not carry %v naming %s", stderr, want, tc.Field)
			}
		})
	}
}

func TestRenderUsageAndIOErrors(t *testing.T) {
	if code, _, _ := renderCLI(t, ""); code != 2 {
		t.Errorf("no -f: exit %d, want 2", code)
	}
	if code, _, stderr := renderCLI(t, "", "-f", filepath.Join(t.TempDir(), "missing.yaml")); code != 1 || !strings.Contains(stderr, "no such file") {
		t.Errorf("missing file: exit %d, %s", code, stderr)
	}
	if code, _, stderr := renderCLI(t, "# nothing\n", "-f", "-"); code != 1 || !strings.Contains(stderr, "no KVRoutedModel") {
		t.Errorf("empty input: exit %d, %s", code, stderr)
	}
	if code, _, _ := renderCLI(t, "{{{", "-f", "-"); code != 1 {
		t.Errorf("garbage: exit %d", code)
	}
}

func TestRenderEverySample(t *testing.T) {
	files, _ := filepath.Glob("../../config/samples/serving_v1alpha1_*.yaml")
	if len(files) < 6 {
		t.Fatalf("samples: %v", files)
	}
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if code, out, stderr := renderCLI(t, string(b), "-f", "-"); code != 0 || !strings.Contains(out, "kind: Deployment") {
			t.Errorf("%s: exit %d: %s", f, code, stderr)
		}
	}
}

// TestRenderNamesEveryBadDocumentWithItsLine: a duplicate key, an invalid spec and a valid
// model with a misspelt engine flag in one stream: both refusals are reported with the line
// their document starts on (the duplicate at its own file line), the typo as a warning with
// the nearest flag, and nothing is rendered.
func TestRenderNamesEveryBadDocumentWithItsLine(t *testing.T) {
	in := `apiVersion: serving.kvroute.io/v1alpha1
kind: KVRoutedModel
metadata: {name: a}
spec:
  model: {name: a, uri: org/a}
---
apiVersion: serving.kvroute.io/v1alpha1
kind: KVRoutedModel
metadata: {name: b}
spec:
  replicas: 1
  model: {name: b, uri: org/b}
  replicas: 2
--- # the third
apiVersion: serving.kvroute.io/v1alpha1
kind: KVRoutedModel
metadata: {name: c}
spec:
  model: {name: c, uri: org/c}
  engine: {port: 5557}
---
apiVersion: serving.kvroute.io/v1alpha1
kind: KVRoutedModel
metadata: {name: d}
spec:
  model: {name: d, uri: org/d}
  engine: {args: ["--gpu-memory-utilisation", "0.8"]}
`
	code, out, stderr := renderCLI(t, in, "-f", "-")
	if code != 1 || out != "" {
		t.Fatalf("exit %d, stdout %d bytes", code, len(out))
	}
	for _, want := range []string{
		`-:7: document 2: decode: `, `line 13: key "replicas" already set in map`,
		`-:15: document 3: `, `spec.engine.port 5557 collides with the KV event ports`,
		`-:22: document 4 (default/d): warning: spec.engine.args[0] "--gpu-memory-utilisation" is not an option of ` + "`vllm serve`" + ` of vLLM`,
		`did you mean --gpu-memory-utilization?`,
		`2 of 4 documents refused`,
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "document 1") {
		t.Errorf("the valid first document was reported:\n%s", stderr)
	}
}

// A warning alone does not stop the render.
func TestRenderWarnsOnUnknownFlagAndStillRenders(t *testing.T) {
	in := `apiVersion: serving.kvroute.io/v1alpha1
kind: KVRoutedModel
metadata: {name: d}
spec:
  model: {name: d, uri: org/d}
  engine: {args: ["--max-model-len", "4096", "--enable-chunked-prefil"]}
`
	code, out, stderr := renderCLI(t, in, "-f", "-")
	if code != 0 || !strings.Contains(out, "kind: Deployment") {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stderr, `spec.engine.args[2] "--enable-chunked-prefil"`) || !strings.Contains(stderr, "did you mean --enable-chunked-prefill?") {
		t.Errorf("stderr %q", stderr)
	}
}
