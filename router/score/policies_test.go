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

// One list of policy names (the project's interface contract): the CRD's enum is the
// production policies, router/config validation and kvrouter's --policy help take every policy,
// kvbench's flags take score.Names too, and every listed name is a registered policy.
func TestOnePolicyList(t *testing.T) {
	for _, n := range score.Names() {
		p, err := score.New(n, score.Options{})
		if err != nil || p.Name() != n {
			t.Errorf("listed policy %q: %v", n, err)
		}
	}
	if !slices.Equal(config.Policies, score.Names()) {
		t.Errorf("router/config.Policies %v is not score.Names() %v", config.Policies, score.Names())
	}
	for _, n := range score.Names() {
		c := config.Default()
		c.Policy = n
		if err := c.Validate(); err != nil {
			t.Errorf("config refuses policy %q: %v", n, err)
		}
	}
	types, err := os.ReadFile("../../api/v1alpha1/kvroutedmodel_types.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)\+kubebuilder:validation:Enum=([^\n]*)\n\s*// \+optional\n\s*Policy string`).FindSubmatch(types)
	if m == nil {
		t.Fatal("spec.router.policy's enum marker not found")
	}
	if got := strings.Split(string(m[1]), ";"); !slices.Equal(got, score.ProductionPolicies) {
		t.Errorf("CRD enum %v, want score.ProductionPolicies %v", got, score.ProductionPolicies)
	}
	// spec.router.shadowPolicy compares production with the peers: it offers every policy.
	m = regexp.MustCompile(`(?s)\+kubebuilder:validation:Enum=([^\n]*)\n\s*// \+optional\n\s*ShadowPolicy string`).FindSubmatch(types)
	if m == nil {
		t.Fatal("shadowPolicy's enum marker not found")
	}
	if got, want := sorted(strings.Split(string(m[1]), ";")), sorted(score.Names()); !slices.Equal(got, want) {
		t.Errorf("shadowPolicy enum %v, want every policy %v", got, want)
	}
	// The generated CRD's spec.router.policy offers exactly the production policies. (Its
	// shadowPolicy takes every policy on purpose: a shadow compares production with the peers.)
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
		got := v.Schema.OpenAPIV3Schema.Properties.Spec.Properties.Router.Properties["policy"].Enum
		if !slices.Equal(got, score.ProductionPolicies) {
			t.Errorf("the generated CRD's spec.router.policy offers %v, want %v (make manifests)", got, score.ProductionPolicies)
		}
	}
	for _, n := range score.BenchmarkPolicies {
		if slices.Contains(score.ProductionPolicies, n) {
			t.Errorf("%q is listed both as a production and a benchmark policy", n)
		}
	}
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
