package ship

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/kvroute/kvroute/test/envtestenv"
)

// One control plane for the package; it starts without CRDs, because the test installs the
// CRD from dist/install.yaml the way a user would.
var (
	root    string
	restCfg *rest.Config
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if root, err = envtestenv.ModuleRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	assets, err := envtestenv.AssetsDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets}
	if restCfg, err = env.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start envtest:", err)
		return 1
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop envtest:", err)
	}
	return code
}

// kustomizeBuild renders a kustomization the way `make build-installer` does (the same
// --load-restrictor, because config/default takes the CRD and ClusterRole by file).
func kustomizeBuild(t *testing.T, dir string) []byte {
	t.Helper()
	opts := krusty.MakeDefaultOptions()
	opts.LoadRestrictions = types.LoadRestrictionsNone
	opts.Reorder = krusty.ReorderOptionLegacy // the kustomize binary's default
	res, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), filepath.Join(root, dir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func readFile(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
