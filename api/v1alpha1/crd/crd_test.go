package crd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// The annotation kubectl's client-side apply writes holds the whole object; over 256 KiB the
// CRD could only be applied server-side.
const lastAppliedLimit = 262144

func TestEmbeddedCopyMatchesConfig(t *testing.T) {
	bases := filepath.Join("..", "..", "..", "config", "crd", "bases")
	entries, err := filepath.Glob(filepath.Join(bases, "*.yaml"))
	if err != nil || len(entries) == 0 {
		t.Fatalf("no CRDs under %s (err %v)", bases, err)
	}
	for _, src := range entries {
		want, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Base(src))
		if err != nil {
			t.Fatalf("%s has no embedded copy: run `make manifests` (%v)", src, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("api/v1alpha1/crd/%s differs from %s: run `make manifests`", filepath.Base(src), src)
		}
	}
	if !bytes.Equal(KVRoutedModelYAML, mustRead(t, "serving.kvroute.io_kvroutedmodels.yaml")) {
		t.Error("embedded bytes differ from the file next to them")
	}
}

func TestCRDFitsClientSideApply(t *testing.T) {
	// kubectl (and Argo CD's client-side apply) store the object as compact JSON, not as the
	// YAML it was read from, whose indentation would count tens of KiB more.
	j, err := yaml.YAMLToJSON(KVRoutedModelYAML)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(j); n >= lastAppliedLimit {
		t.Fatalf("CRD is %d bytes as JSON, over the %d-byte last-applied-configuration limit: shorten descriptions or move a large upstream type out of the schema", n, lastAppliedLimit)
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCRDShape(t *testing.T) {
	var c apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(KVRoutedModelYAML, &c); err != nil {
		t.Fatal(err)
	}
	if c.Spec.Group != "serving.kvroute.io" || c.Spec.Scope != apiextensionsv1.NamespaceScoped ||
		c.Spec.Names.Kind != "KVRoutedModel" || len(c.Spec.Names.ShortNames) != 1 || c.Spec.Names.ShortNames[0] != "kvrm" {
		t.Errorf("names/scope = %+v %s", c.Spec.Names, c.Spec.Scope)
	}
	if len(c.Spec.Versions) != 1 || c.Spec.Versions[0].Name != "v1alpha1" {
		t.Fatalf("versions = %+v", c.Spec.Versions)
	}
	v := c.Spec.Versions[0]
	sr := v.Subresources
	if sr == nil || sr.Status == nil || sr.Scale == nil || sr.Scale.SpecReplicasPath != ".spec.replicas" ||
		sr.Scale.StatusReplicasPath != ".status.replicas" || sr.Scale.LabelSelectorPath == nil || *sr.Scale.LabelSelectorPath != ".status.selector" {
		t.Errorf("subresources = %+v", sr)
	}
	var cols []string
	for _, col := range v.AdditionalPrinterColumns {
		if col.Priority == 0 {
			cols = append(cols, col.Name)
		}
	}
	if got, want := strings.Join(cols, ","), "Ready,Replicas,Warming,Index,Endpoint,Age"; got != want {
		t.Errorf("printer columns = %s, want %s", got, want)
	}
}
