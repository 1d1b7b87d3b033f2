package release

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/test/envtestenv"
)

// kvrouter links gRPC through the OTLP trace exporter; built without the grpcnotrace tag, gRPC
// pulls in html/template, whose reflection turns off the linker's dead-code removal and grows
// the binary by some 30 MB. The image's build line and `make build` carry the tag, and with it
// no template package is linked.
func TestKVRouterBuildsWithoutTemplates(t *testing.T) {
	line := ""
	lines := strings.Split(read(t, "Dockerfile.kvrouter"), "\n")
	for i, l := range lines {
		if l == "# BUILD: kvrouter" && i+1 < len(lines) {
			line = lines[i+1]
		}
	}
	if !strings.Contains(line, "-tags grpcnotrace") {
		t.Errorf("Dockerfile.kvrouter's build line %q lacks -tags grpcnotrace", line)
	}
	if mk := read(t, "Makefile"); !strings.Contains(mk, "GOTAGS        ?= grpcnotrace") {
		t.Errorf("the Makefile does not build with GOTAGS grpcnotrace")
	}
	root, err := envtestenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-tags", "grpcnotrace", "-deps", "./cmd/kvrouter")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "text/template" || p == "html/template" {
			t.Errorf("kvrouter built with grpcnotrace still links %s", p)
		}
	}
}
