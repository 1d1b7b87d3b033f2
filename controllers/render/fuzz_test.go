package render_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvroute/kvroute/api/v1alpha1/validation"
	"github.com/kvroute/kvroute/controllers/render"
)

// FuzzRender: whatever the CRD admits, the renderers render without panicking, and what
// they render encodes.
func FuzzRender(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(samplesDir, "serving_v1alpha1_*.yaml"))
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	v, err := validation.New()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		m, err := v.Admit(context.Background(), doc, "default")
		if err != nil {
			return
		}
		objs, err := render.All(m, testOpts)
		if err != nil {
			return
		}
		if _, err := render.YAML(objs); err != nil {
			t.Fatalf("admitted resource renders objects that do not encode: %v", err)
		}
	})
}
