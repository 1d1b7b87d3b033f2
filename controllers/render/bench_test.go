package render_test

import (
	"testing"

	"github.com/kvroute/kvroute/controllers/render"
)

// BenchmarkAll is one reconcile's rendering work for the largest sample.
func BenchmarkAll(b *testing.B) {
	m := sample(b, "dp2tp2")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := render.All(m, testOpts); err != nil {
			b.Fatal(err)
		}
	}
}
