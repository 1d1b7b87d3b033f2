package validation_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/api/v1alpha1/validation"
	"github.com/kvroute/kvroute/api/v1alpha1/validation/validationtest"
)

const casesFile = "../../../testdata/render/invalid-cases.yaml"

func newValidator(t *testing.T) *validation.Validator {
	t.Helper()
	v, err := validation.New()
	if err != nil {
		t.Fatalf("embedded CRD: %v", err)
	}
	return v
}

func samples(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../../config/samples/serving_v1alpha1_*.yaml")
	if err != nil || len(files) < 6 {
		t.Fatalf("want the six samples, got %v (%v)", files, err)
	}
	return files
}

func TestSamplesAreAdmittedAndDefaulted(t *testing.T) {
	v := newValidator(t)
	for _, f := range samples(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m, err := v.Admit(context.Background(), b, "default")
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		e := m.Spec.Engine
		if m.Spec.Replicas == nil || e.Port == 0 || e.BlockSize == 0 || e.HashSeed == "" || e.KVEvents.Enabled == nil ||
			e.KVEvents.ReplayBasePort == nil || m.Spec.Router.Warmup.Duration == nil || m.Spec.NetworkPolicy.Enabled == nil {
			t.Errorf("%s: defaults missing: %+v", f, m.Spec)
		}
	}
}

func TestDefaultsMatchTheContract(t *testing.T) {
	v := newValidator(t)
	m, err := v.Admit(context.Background(), []byte(`
apiVersion: serving.kvroute.io/v1alpha1
kind: KVRoutedModel
metadata: {name: m}
spec: {model: {name: m, uri: org/m}, autoscaling: {provider: KEDA, maxReplicas: 2, keda: {prometheus: {serverAddress: "http://p"}}}}
`), "ns1")
	if err != nil {
		t.Fatal(err)
	}
	s := m.Spec
	e := s.Engine
	checks := []struct {
		name string
		ok   bool
	}{
		{"namespace from caller", m.Namespace == "ns1"},
		{"replicas 1", *s.Replicas == 1},
		{"engine.port 8000", e.Port == 8000},
		{"tensor 1, dataLocal 1", e.Parallelism.Tensor == 1 && e.Parallelism.DataLocal == 1},
		{"blockSize 16", e.BlockSize == 16},
		{"hashAlgo sha256", e.HashAlgo == "sha256"},
		{"hashSeed 0", e.HashSeed == "0"},
		{"events on", *e.KVEvents.Enabled},
		{"basePort 5557", e.KVEvents.BasePort == 5557},
		{"replayBasePort 5600", *e.KVEvents.ReplayBasePort == 5600},
		{"topicPrefix kv", e.KVEvents.TopicPrefix == "kv"},
		{"hwm 100000", *e.KVEvents.HWM == 100000},
		{"bufferSteps 10000", e.KVEvents.BufferSteps == 10000},
		{"router.replicas unset (the renderer's 2)", s.Router.Replicas == nil},
		{"router service ClusterIP:8000", s.Router.Service.Type == "ClusterIP" && s.Router.Service.Port == 8000},
		{"router resources small requests", s.Router.Resources != nil && s.Router.Resources.Requests.Cpu().String() == "100m"},
		{"policy kv", s.Router.Policy == "kv"},
		{"warmup 2m / 0.5", s.Router.Warmup.Duration.Duration.String() == "2m0s" && s.Router.Warmup.Credit.Float64() == 0.5},
		{"networkPolicy on, monitoring", *s.NetworkPolicy.Enabled && len(s.NetworkPolicy.AllowFrom) == 1 &&
			s.NetworkPolicy.AllowFrom[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == "monitoring"},
		{"minReplicas 1", *s.Autoscaling.MinReplicas == 1},
		{"targetQueuePerReplica 4", s.Autoscaling.TargetQueuePerReplica.String() == "4"},
		{"targetBacklogPerReplica 1", s.Autoscaling.TargetBacklogPerReplica.String() == "1"},
		{"keda polling 15 / cooldown 300", *s.Autoscaling.KEDA.PollingInterval == 15 && *s.Autoscaling.KEDA.CooldownPeriod == 300},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("default %s not applied", c.name)
		}
	}
}

func TestZeroValuesSurviveDefaulting(t *testing.T) {
	// replicas 0, replay 0, events off, hwm 0 and credit 0 are settings, not "unset".
	v := newValidator(t)
	m, err := v.Admit(context.Background(), []byte(`
apiVersion: serving.kvroute.io/v1alpha1
kind: KVRoutedModel
metadata: {name: m}
spec:
  model: {name: m, uri: org/m}
  replicas: 0
  engine: {kvEvents: {enabled: false, replayBasePort: 0, hwm: 0}}
  router: {warmup: {credit: 0}}
  networkPolicy: {enabled: false, allowFrom: []}
`), "default")
	if err != nil {
		t.Fatal(err)
	}
	ev := m.Spec.Engine.KVEvents
	if *m.Spec.Replicas != 0 || *ev.Enabled || *ev.ReplayBasePort != 0 || *ev.HWM != 0 ||
		m.Spec.Router.Warmup.Credit.String() != "0" || *m.Spec.NetworkPolicy.Enabled || len(m.Spec.NetworkPolicy.AllowFrom) != 0 {
		t.Errorf("a zero setting was replaced by its default: %+v", m.Spec)
	}
}

func TestDefaultModelFillsATypedObject(t *testing.T) {
	v := newValidator(t)
	m := &v1alpha1.KVRoutedModel{}
	m.Name, m.Namespace = "m", "default"
	m.Spec.Model = v1alpha1.ModelSpec{Name: "m", URI: "org/m"}
	if err := v.DefaultModel(m); err != nil {
		t.Fatal(err)
	}
	if m.Spec.Replicas == nil || m.Spec.Engine.Port != 8000 || m.Spec.Router.Resources == nil || m.Spec.Router.Warmup.Credit.String() != "0.5" {
		t.Errorf("DefaultModel left defaults out: %+v", m.Spec)
	}
}

func TestAdmitRejectsWrongKindAndGarbage(t *testing.T) {
	v := newValidator(t)
	for _, doc := range []string{
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
		"apiVersion: serving.kvroute.io/v2\nkind: KVRoutedModel\nmetadata: {name: x}\n",
		"{{{{",
		"",
		"- a\n- b\n",
	} {
		if _, err := v.Admit(context.Background(), []byte(doc), "default"); err == nil {
			t.Errorf("Admit(%q) succeeded", doc)
		}
	}
}

// A key given twice is refused (the last one winning would hide an edit), naming the key and
// its line.
func TestAdmitRefusesDuplicateKeys(t *testing.T) {
	v := newValidator(t)
	doc := "apiVersion: serving.kvroute.io/v1alpha1\nkind: KVRoutedModel\nmetadata: {name: x}\nspec:\n  model: {name: m, uri: org/m}\n  replicas: 1\n  replicas: 3\n"
	_, err := v.Admit(context.Background(), []byte(doc), "default")
	if err == nil || !strings.Contains(err.Error(), `line 7: key "replicas" already set`) {
		t.Errorf("Admit = %v", err)
	}
}

// TestInvalidCasesOffline runs the shared table through the offline validator; the envtest
// test below checks kube-apiserver gives the same message.
func TestInvalidCasesOffline(t *testing.T) {
	v := newValidator(t)
	cases, err := validationtest.Load(casesFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) < 30 {
		t.Fatalf("only %d cases", len(cases))
	}
	for i, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			_, err := v.Admit(context.Background(), c.YAML(i), "default")
			if err == nil {
				t.Fatalf("admitted:\n%s", c.YAML(i))
			}
			if !strings.Contains(err.Error(), c.Field) || !strings.Contains(err.Error(), c.Contains) {
				t.Fatalf("error does not name %q (and %q):\n%v", c.Field, c.Contains, err)
			}
		})
	}
}

func FuzzAdmit(f *testing.F) {
	for _, s := range []string{
		"apiVersion: serving.kvroute.io/v1alpha1\nkind: KVRoutedModel\nmetadata: {name: m}\nspec: {model: {name: m, uri: org/m}}\n",
		"apiVersion: serving.kvroute.io/v1alpha1\nkind: KVRoutedModel\nmetadata: {name: m}\nspec: {engine: {args: [--port]}}\n",
	} {
		f.Add([]byte(s))
	}
	v, err := validation.New()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		_, _ = v.Admit(context.Background(), doc, "default") // must not panic
	})
}
