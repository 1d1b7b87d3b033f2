package score_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/score"
	"sigs.k8s.io/yaml"
)

// One list of policy names: score.ProductionPolicies is what kvrouter offers, router/config
// accepts and the CRD's spec.router.policy and shadowPolicy enums list; every listed name is a
// production policy. (kvbench adds the benchmark policies to its own registry, sim/policies.)
func TestOnePolicyList(t *testing.T) {
	reg := score.Production()
	if !slices.Equal(reg.Names(), score.ProductionPolicies) {
		t.Errorf("score.Production() offers %v, want %v", reg.Names(), score.ProductionPolicies)
	}
	for _, n := range score.ProductionPolicies {
		p, err := reg.New(n, score.Options{})
		if err != nil || p.Name() != n {
			t.Errorf("listed policy %q: %v", n, err)
		}
	}
	if !slices.Equal(config.Policies, score.ProductionPolicies) {
		t.Errorf("router/config.Policies %v is not score.ProductionPolicies %v", config.Policies, score.ProductionPolicies)
	}
	for _, n := range score.ProductionPolicies {
		c := config.Default()
		c.Policy, c.ShadowPolicy = n, n
		if err := c.Validate(); err != nil {
			t.Errorf("config refuses policy %q: %v", n, err)
		}
	}
	types, err := os.ReadFile("../../api/v1alpha1/kvroutedmodel_types.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"Policy", "ShadowPolicy"} {
		m := regexp.MustCompile(`(?s)\+kubebuilder:validation:Enum=([^\n]*)\n\s*// \+optional\n\s*` + field + ` string`).FindSubmatch(types)
		if m == nil {
			t.Fatalf("spec.router.%s's enum marker not found", field)
		}
		if got := strings.Split(string(m[1]), ";"); !slices.Equal(got, score.ProductionPolicies) {
			t.Errorf("CRD %s enum %v, want score.ProductionPolicies %v", field, got, score.ProductionPolicies)
		}
	}
	// The generated CRD's spec.router.policy and shadowPolicy offer exactly the production
	// policies.
	raw, err := os.ReadFile("../../config/crd/bases/serving.kvroute.io_kvroutedmodels.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema struct {
						Properties struct {
							Spec struct {
								Properties struct {
									Router struct {
										Properties map[string]struct {
											Enum []string `json:"enum"`
										} `json:"properties"`
									} `json:"router"`
								} `json:"properties"`
							} `json:"spec"`
						} `json:"properties"`
					} `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &crd); err != nil || len(crd.Spec.Versions) == 0 {
		t.Fatalf("generated CRD: %v", err)
	}
	for _, v := range crd.Spec.Versions {
		for _, key := range []string{"policy", "shadowPolicy"} {
			got := v.Schema.OpenAPIV3Schema.Properties.Spec.Properties.Router.Properties[key].Enum
			if !slices.Equal(got, score.ProductionPolicies) {
				t.Errorf("the generated CRD's spec.router.%s offers %v, want %v (make manifests)", key, got, score.ProductionPolicies)
			}
		}
	}
}
