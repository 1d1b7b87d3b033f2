// Package envtestenv starts a real kube-apiserver + etcd for tests (controller-runtime's
// envtest) without make: the binaries come from KUBEBUILDER_ASSETS when set, otherwise from
// hack/envtest-assets.sh, which builds them once from the Go module proxy and caches them.
package envtestenv

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// ModuleRoot walks up from the working directory (a test's package directory) to go.mod.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("envtestenv: no go.mod above the working directory")
		}
		dir = parent
	}
}

// CRDBases is config/crd/bases of this module.
func CRDBases() (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "config", "crd", "bases"), nil
}

// AssetsDir returns the directory holding kube-apiserver, etcd and kubectl.
func AssetsDir() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(root, "hack", "envtest-assets.sh"))
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("envtestenv: hack/envtest-assets.sh: %v\n%s", err, stderr.String())
	}
	dir := strings.TrimSpace(stdout.String())
	if dir == "" {
		return "", errors.New("envtestenv: hack/envtest-assets.sh printed no directory")
	}
	return dir, nil
}

// Start starts a control plane with the CRDs in crdDirs installed (config/crd/bases when
// none are given). The caller stops it with env.Stop().
func Start(crdDirs ...string) (*envtest.Environment, *rest.Config, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, nil, err
	}
	if len(crdDirs) == 0 {
		bases, err := CRDBases()
		if err != nil {
			return nil, nil, err
		}
		crdDirs = []string{bases}
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     crdDirs,
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, nil, fmt.Errorf("envtestenv: start control plane from %s: %w", assets, err)
	}
	return env, cfg, nil
}
