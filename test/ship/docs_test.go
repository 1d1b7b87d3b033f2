package ship

import (
	"bytes"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// docs/configuration.md is the generator's output for the committed CRD.
func TestConfigurationReferenceIsCurrent(t *testing.T) {
	cmd := exec.Command("go", "run", "hack/gen-config-reference.go", "config/crd/bases/serving.kvroute.io_kvroutedmodels.yaml")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	want, err := cmd.Output()
	if err != nil {
		t.Fatalf("gen-config-reference: %v\n%s", err, stderr.String())
	}
	if !bytes.Contains(want, []byte("`spec.engine.hashSeed`")) {
		t.Fatalf("generator output lacks spec.engine.hashSeed:\n%.400s", want)
	}
	if got := readFile(t, "docs/configuration.md"); !bytes.Equal(got, want) {
		t.Fatal("docs/configuration.md is not the generator's output for the CRD: run `make docs`")
	}
}

// The docs name every condition reason the operator sets, and their relative links resolve.
func TestDocsCoverConditionsAndLinksResolve(t *testing.T) {
	ops := string(readFile(t, "docs/operations.md"))
	for _, r := range []string{"Ready", "Available", "Progressing", "Degraded", "RollingOut", "Scaling", "WarmingUp",
		"NoReplicasReady", "RouterNotReady", "ApplyFailed", "InvalidSpec", "ProgressDeadlineExceeded", "KEDANotInstalled", "MetricsAPIUnavailable", "Suspended"} {
		if !strings.Contains(ops, "`"+r+"`") {
			t.Errorf("docs/operations.md does not explain `%s`", r)
		}
	}
	link := regexp.MustCompile(`\]\(([^)#:]+)(#[^)]*)?\)`)
	for _, doc := range []string{"docs/install.md", "docs/operations.md", "docs/architecture.md"} {
		for _, m := range link.FindAllStringSubmatch(string(readFile(t, doc)), -1) {
			readFile(t, "docs/"+m[1]) // fails the test when the target is missing
		}
	}
}
