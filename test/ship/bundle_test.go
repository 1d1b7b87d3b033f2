package ship

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/test/ship/olmbundle"
)

var createdAtLine = regexp.MustCompile(`(?m)^    createdAt: .*$`)

// committedVersion reads spec.version of the committed CSV, so `make bundle VERSION=x` and the
// test agree without the test knowing x.
func committedVersion(t *testing.T) (version, createdAt string) {
	t.Helper()
	var csv struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Spec struct {
			Version string `json:"version"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(readFile(t, "bundle/manifests/kvroute.clusterserviceversion.yaml"), &csv); err != nil {
		t.Fatal(err)
	}
	return csv.Spec.Version, csv.Metadata.Annotations["createdAt"]
}

func TestBundleIsCurrent(t *testing.T) {
	version, createdAt := committedVersion(t)
	files, err := olmbundle.Generate(kustomizeBuild(t, "config/manifests"), olmbundle.Options{
		Version: version, CreatedAt: createdAt, Icon: readFile(t, "config/manifests/icon.svg"),
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(root, "bundle", name))
		if err != nil {
			t.Errorf("bundle/%s: %v (run `make bundle`)", name, err)
			continue
		}
		if !bytes.Equal(createdAtLine.ReplaceAll(got, nil), createdAtLine.ReplaceAll(want, nil)) {
			t.Errorf("bundle/%s is not what `make bundle` writes now: run `make bundle`", name)
		}
	}
	for _, sub := range []string{"manifests", "metadata", "tests"} {
		err := filepath.WalkDir(filepath.Join(root, "bundle", sub), func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				rel, _ := filepath.Rel(filepath.Join(root, "bundle"), p)
				if _, ok := files[filepath.ToSlash(rel)]; !ok {
					t.Errorf("bundle/%s is stale: `make bundle` no longer writes it", rel)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestBundleValidates runs operator-framework/api's validators: the default bundle set plus
// OperatorHub's, good practices and the deprecated-API check for the Kubernetes release the
// project is built against. Errors fail the test; warnings are logged.
func TestBundleValidates(t *testing.T) {
	b, err := manifests.GetBundleFromDir(filepath.Join(root, "bundle", "manifests"))
	if err != nil {
		t.Fatalf("load bundle: %v", err)
	}
	if b.CSV == nil || len(b.V1CRDs) != 1 {
		t.Fatalf("bundle has CSV %v and %d v1 CRDs; want one of each", b.CSV != nil, len(b.V1CRDs))
	}
	validators := validation.DefaultBundleValidators.WithValidators(
		validation.OperatorHubV2Validator,
		validation.GoodPracticesValidator,
		validation.AlphaDeprecatedAPIsValidator,
	)
	objs := append(b.ObjectsToValidate(), map[string]string{"k8s-version": "1.37"})
	results := validators.Validate(objs...)
	seen := 0
	for _, r := range results {
		for _, e := range r.Errors {
			t.Errorf("%s %s: %v", r.Name, e.Type, e)
		}
		for _, w := range r.Warnings {
			t.Logf("warning: %s: %v", r.Name, w)
		}
		seen++
	}
	if seen == 0 {
		t.Fatal("the validators returned no results at all")
	}
}

func TestBundleCSVContent(t *testing.T) {
	b, err := manifests.GetBundleFromDir(filepath.Join(root, "bundle", "manifests"))
	if err != nil {
		t.Fatal(err)
	}
	csv := b.CSV
	if csv.Spec.MinKubeVersion == "" || csv.Spec.Maturity != "alpha" || len(csv.Spec.Icon) != 1 || len(csv.Spec.Keywords) == 0 {
		t.Errorf("CSV lacks minKubeVersion, maturity alpha, icon or keywords: %+v", csv.Spec)
	}
	modes := map[string]bool{}
	for _, m := range csv.Spec.InstallModes {
		modes[string(m.Type)] = m.Supported
	}
	if !modes["AllNamespaces"] || len(modes) != 4 {
		t.Errorf("install modes %v: want all four listed, AllNamespaces supported (the manager watches every namespace)", modes)
	}
	owned := csv.Spec.CustomResourceDefinitions.Owned
	if len(owned) != 1 || owned[0].Name != "kvroutedmodels.serving.kvroute.io" || len(owned[0].SpecDescriptors) == 0 || len(owned[0].StatusDescriptors) == 0 {
		t.Errorf("owned CRDs %+v: want kvroutedmodels with spec and status descriptors", owned)
	}
	if !strings.Contains(csv.Annotations["alm-examples"], `"kind": "KVRoutedModel"`) {
		t.Error("alm-examples holds no KVRoutedModel")
	}
	images := map[string]string{}
	for _, ri := range csv.Spec.RelatedImages {
		images[ri.Name] = ri.Image
	}
	if images["manager"] == "" || images["kvrouter"] == "" || images["vllm"] == "" {
		t.Errorf("relatedImages %v: want manager, kvrouter and vllm for disconnected installs", images)
	}
	if csv.Annotations["containerImage"] != images["manager"] {
		t.Errorf("containerImage %q is not the manager image %q", csv.Annotations["containerImage"], images["manager"])
	}
}

// bundle.Dockerfile's LABELs must say what metadata/annotations.yaml says.
func TestBundleDockerfileLabels(t *testing.T) {
	var ann struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := yaml.Unmarshal(readFile(t, "bundle/metadata/annotations.yaml"), &ann); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{}
	for _, line := range strings.Split(string(readFile(t, "bundle.Dockerfile")), "\n") {
		if kv, ok := strings.CutPrefix(line, "LABEL "); ok {
			k, v, _ := strings.Cut(kv, "=")
			labels[k] = v
		}
	}
	if len(ann.Annotations) == 0 {
		t.Fatal("annotations.yaml is empty")
	}
	for k, v := range ann.Annotations {
		if labels[k] != v {
			t.Errorf("bundle.Dockerfile LABEL %s=%q, annotations.yaml says %q", k, labels[k], v)
		}
	}
	if len(labels) != len(ann.Annotations) {
		t.Errorf("bundle.Dockerfile has %d LABELs, annotations.yaml %d keys", len(labels), len(ann.Annotations))
	}
}
