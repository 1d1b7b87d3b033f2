package release

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/test/envtestenv"
)

// The manager's Dockerfile copies only part of the tree: every package of this module that
// ./cmd/manager imports must be under one of its COPY lines, or `docker build` fails (as
// hack/docker-build-check.sh checks; this runs in make test).
func TestManagerDockerfileCopiesEveryImport(t *testing.T) {
	root, err := envtestenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	cmd := exec.Command(goBin, "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}", "./cmd/manager")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var copies []string
	for _, l := range strings.Split(read(t, "Dockerfile"), "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[0] == "COPY" && !strings.HasPrefix(f[1], "--") && f[1] != "go.mod" {
			copies = append(copies, strings.TrimSuffix(f[1], "/")+"/")
		}
	}
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		rel = filepath.ToSlash(rel) + "/"
		covered := false
		for _, c := range copies {
			covered = covered || strings.HasPrefix(rel, c)
		}
		if !covered {
			t.Errorf("Dockerfile does not COPY %s, which ./cmd/manager imports", rel)
		}
	}
}
