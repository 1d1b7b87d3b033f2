package envtestenv

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/discovery"
)

func TestModuleRootHasGoMod(t *testing.T) {
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "hack", "envtest-assets.sh")); err != nil {
		t.Fatalf("module root %s has no hack/envtest-assets.sh: %v", root, err)
	}
}

func TestStartServesTheCRD(t *testing.T) {
	env, cfg, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := dc.ServerResourcesForGroupVersion("serving.kvroute.io/v1alpha1")
	if err != nil {
		t.Fatalf("CRD not served: %v", err)
	}
	found := false
	for _, r := range res.APIResources {
		if r.Name == "kvroutedmodels" && len(r.ShortNames) == 1 && r.ShortNames[0] == "kvrm" {
			found = true
		}
	}
	if !found {
		t.Fatalf("kvroutedmodels (short name kvrm) missing from %+v", res.APIResources)
	}
}
