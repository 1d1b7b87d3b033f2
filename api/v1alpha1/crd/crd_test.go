package crd

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
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
	if n := len(KVRoutedModelYAML); n >= lastAppliedLimit {
		t.Fatalf("CRD is %d bytes, over the %d-byte last-applied-configuration limit", n, lastAppliedLimit)
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
