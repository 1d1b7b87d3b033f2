package envtestenv

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fakeArchive is an envtest archive as controller-tools publishes it: controller-tools/envtest/
// holding kube-apiserver, etcd and kubectl (here small scripts).
func fakeArchive(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, b := range []string{"kube-apiserver", "etcd", "kubectl"} {
		body := []byte("#!/bin/sh\necho " + b + "\n")
		if err := tw.WriteHeader(&tar.Header{Name: "controller-tools/envtest/" + b, Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

// runAssets runs hack/envtest-assets.sh with a fresh cache, the given index and no build fallback.
func runAssets(t *testing.T, indexURL string) (string, string, error) {
	t.Helper()
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(root, "hack", "envtest-assets.sh"))
	cmd.Env = append(os.Environ(), "KVROUTE_CACHE_DIR="+t.TempDir(), "KUBE_VERSION=1.99.0",
		"ENVTEST_INDEX_URL="+indexURL, "ENVTEST_BUILD=0", "ENVTEST_DOWNLOAD=1")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return strings.TrimSpace(out.String()), errb.String(), err
}

// The fast path: the index's archive is fetched, checked against its SHA-512 and unpacked; a
// mismatching archive is refused, and an unreachable index is given up on at once.
func TestEnvtestAssetsDownload(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("needs curl")
	}
	archive := fakeArchive(t)
	sum := sha512.Sum512(archive)
	hash := hex.EncodeToString(sum[:])
	name := fmt.Sprintf("envtest-v1.99.0-%s-%s.tar.gz", runtime.GOOS, runtime.GOARCH)
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/good.yaml", "/bad.yaml":
			h := hash
			if r.URL.Path == "/bad.yaml" {
				h = strings.Repeat("0", len(hash))
			}
			fmt.Fprintf(w, "releases:\n  v1.98.0:\n    %s:\n      hash: %s\n      selfLink: %s/nope\n  v1.99.0:\n    %s:\n      hash: %s\n      selfLink: %s/%s\n",
				strings.Replace(name, "1.99.0", "1.98.0", 1), strings.Repeat("1", len(hash)), srv.URL, name, h, srv.URL, name)
		case "/" + name:
			w.Write(archive)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()

	dir, logs, err := runAssets(t, srv.URL+"/good.yaml")
	if err != nil {
		t.Fatalf("%v\n%s", err, logs)
	}
	for _, b := range []string{"kube-apiserver", "etcd", "kubectl"} {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.Mode()&0o100 == 0 {
			t.Errorf("%s/%s: %v", dir, b, err)
		}
	}
	if !strings.Contains(logs, "verified (SHA-512)") {
		t.Errorf("logs: %s", logs)
	}

	if dir, logs, err := runAssets(t, srv.URL+"/bad.yaml"); err == nil || !strings.Contains(logs, "does not match") {
		t.Errorf("a mismatching archive was accepted: %q %v\n%s", dir, err, logs)
	}

	start := time.Now()
	_, logs, err = runAssets(t, "http://127.0.0.1:1/index.yaml")
	if err == nil || !strings.Contains(logs, "not reachable") {
		t.Errorf("unreachable index: %v\n%s", err, logs)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("deciding to build took %s", d)
	}
}
