package validation_test

import (
	"context"
	"os"
	"testing"

	"github.com/kvroute/kvroute/api/v1alpha1/validation"
)

// BenchmarkNew is building the validator from the embedded CRD (once per kvroutectl run).
func BenchmarkNew(b *testing.B) {
	for b.Loop() {
		if _, err := validation.New(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAdmit is pruning, defaulting, OpenAPI and CEL validation of one resource.
func BenchmarkAdmit(b *testing.B) {
	doc, err := os.ReadFile("../../../config/samples/serving_v1alpha1_kvroutedmodel_dp2tp2.yaml")
	if err != nil {
		b.Fatal(err)
	}
	v, err := validation.New()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Admit(context.Background(), doc, "default"); err != nil {
			b.Fatal(err)
		}
	}
}
