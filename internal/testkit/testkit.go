// Package testkit holds the harness pieces several test packages repeated: this module's
// commands built once per test binary (Build, removed by Main or Cleanup), a goroutine-safe
// output buffer (LockedBuffer), and bounded polling (WaitFor, Eventually).
package testkit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// buildTimeout bounds one go build (a cold cache on a loaded 2-core machine takes minutes).
const buildTimeout = 10 * time.Minute

type built struct {
	once sync.Once
	bin  string
	err  error
}

var (
	mu     sync.Mutex
	binDir string // created by the first Build, removed by Cleanup
	builds = map[string]*built{}
)

// Build builds the main package pkg of this module — a path from the module root such as
// "./cmd/kvrouter" or "./hack/podbacker" — once per test binary, and returns the binary's path.
// The build runs in the module root, whatever the test's working directory. The binaries live
// in one temporary directory that Cleanup removes; a package using Build calls Main (or Cleanup)
// from its TestMain. A failed build fails t, every time it is asked for.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	b, err := entry(pkg)
	if err == nil {
		b.once.Do(func() { b.bin, b.err = build(pkg) })
		err = b.err
	}
	if err != nil {
		t.Fatal(err)
	}
	return b.bin
}

func entry(pkg string) (*built, error) {
	if !strings.HasPrefix(pkg, "./") || strings.Contains(pkg, "..") {
		return nil, fmt.Errorf("testkit.Build(%q): want a path from the module root, like ./cmd/kvrouter", pkg)
	}
	mu.Lock()
	defer mu.Unlock()
	b := builds[pkg]
	if b == nil {
		b = &built{}
		builds[pkg] = b
	}
	return b, nil
}

func build(pkg string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	dir, err := tempDir()
	if err != nil {
		return "", err
	}
	// One subdirectory per package, so ./cmd/x and ./hack/x cannot overwrite each other.
	out := filepath.Join(dir, strings.ReplaceAll(strings.TrimPrefix(pkg, "./"), "/", "_"), path.Base(pkg))
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return out, nil
}

func tempDir() (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if binDir == "" {
		d, err := os.MkdirTemp("", "kvroute-testbin-")
		if err != nil {
			return "", err
		}
		binDir = d
	}
	return binDir, nil
}

// moduleRoot is the directory of go.mod: two up from this file, or, where the file name is not
// a path on this machine (a -trimpath build), what `go env GOMOD` says from the working directory.
func moduleRoot() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		root := filepath.Join(filepath.Dir(file), "..", "..")
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			return root, nil
		}
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("testkit: no go.mod above the working directory")
	}
	return filepath.Dir(gomod), nil
}

// Cleanup removes what Build wrote. TestMain calls it after m.Run.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
		binDir = ""
		builds = map[string]*built{}
	}
}

// Main runs the package's tests, removes what Build wrote and exits: a whole TestMain.
func Main(m *testing.M) {
	code := m.Run()
	Cleanup()
	os.Exit(code)
}
