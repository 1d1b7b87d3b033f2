// Package images tests the image tarballs `make images` writes (hack/images.sh): each one is
// read both as an OCI layout and as a `docker save` archive, unpacked into a directory, and its
// binary run there under chroot(2) as the image's user, so no host library can stand in for one
// the image lacks. kvrouter then routes one request to a vllm-sim, both from their images.
//
// It needs root (chroot) and a Debian host with apt (the runtime layer); elsewhere it skips.
//
// In `make test` (the fast subset, well under a minute with a warm cache): the runtime layer
// (libzmq5 and its dependencies from Debian) and the base layer, assembled by hack/ociimage
// around a small cgo program that links libzmq and passes a message over it, run under chroot.
// The full images (TestHelpUnderChroot, TestRouteUnderChroot, TestBundleImage) compile every
// binary with -trimpath, 10-20 minutes on a cold 2-core machine, so they run when asked:
//
//	make test-images                       # builds the images into a temp dir and tests them
//	KVROUTE_IMAGES_DIR=bin/images go test ./test/images/   # tests what `make images` wrote
package images

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kvroute/kvroute/api/v1alpha1/validation"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/sim/simproc"
	"github.com/kvroute/kvroute/test/envtestenv"
)

// version is the tag the tested images carry: v0.1.0-test when this test builds them,
// KVROUTE_IMAGES_VERSION (default: this release, render.Version) for KVROUTE_IMAGES_DIR.
var version = "v0.1.0-test"

var (
	imagesDir  string // the full images, when built or given
	root       string // module root
	canChroot  bool
	skipReason string
)

func TestMain(m *testing.M) {
	os.Exit(setup(m))
}

func setup(m *testing.M) int {
	var err error
	if root, err = envtestenv.ModuleRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	switch {
	case runtime.GOOS != "linux" || os.Geteuid() != 0:
		skipReason = "needs root on Linux for chroot"
	case !haveCmd("apt-get", "apt-cache", "dpkg-deb"):
		skipReason = "needs a Debian host (apt-get, dpkg-deb) for the runtime layer"
	default:
		canChroot = true
	}
	if !canChroot {
		return m.Run()
	}
	if d := os.Getenv("KVROUTE_IMAGES_DIR"); d != "" {
		if !filepath.IsAbs(d) {
			d = filepath.Join(root, d)
		}
		imagesDir = d
		version = render.Version
		if v := os.Getenv("KVROUTE_IMAGES_VERSION"); v != "" {
			version = v
		}
		return m.Run()
	}
	if os.Getenv("KVROUTE_IMAGE_TESTS") == "" {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "kvroute-images-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	cmd := exec.Command("hack/images.sh")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "IMAGES_OUT="+dir, "VERSION="+version, "IMAGE_REPO=kvroute.test")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "hack/images.sh:", err)
		return 1
	}
	fmt.Printf("images: built in %s\n", time.Since(start).Round(time.Second))
	imagesDir = dir
	return m.Run()
}

func haveCmd(names ...string) bool {
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			return false
		}
	}
	return true
}

// need skips a test of the full images unless they were built or given.
func need(t *testing.T) {
	t.Helper()
	if !canChroot {
		t.Skip(skipReason)
	}
	if imagesDir == "" {
		t.Skip("the full images are tested by make test-images (KVROUTE_IMAGE_TESTS=1) or KVROUTE_IMAGES_DIR=DIR")
	}
}

type unpacked struct {
	root string
	cfg  *v1.ConfigFile
}

// unpack reads NAME.tar both ways, checks they agree, and flattens the image into a directory.
func unpack(t *testing.T, name string) unpacked {
	t.Helper()
	return unpackPath(t, filepath.Join(imagesDir, name+".tar"), version)
}

func unpackPath(t *testing.T, path, version string) unpacked {
	t.Helper()
	img, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		t.Fatalf("%s as docker-save archive: %v", path, err)
	}
	// The same tar as an OCI layout.
	lay := t.TempDir()
	if err := untar(path, lay); err != nil {
		t.Fatal(err)
	}
	idx, err := layout.ImageIndexFromPath(lay)
	if err != nil {
		t.Fatalf("%s as OCI layout: %v", path, err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("index.json: %v %+v", err, im)
	}
	if ref := im.Manifests[0].Annotations["io.containerd.image.name"]; !strings.HasSuffix(ref, ":"+version) {
		t.Errorf("index.json names %q, want tag %s", ref, version)
	}
	d1, _ := img.Digest()
	if d1 != im.Manifests[0].Digest {
		// The docker-save reader re-serialises the manifest; compare what it points at instead.
		oimg, err := idx.Image(im.Manifests[0].Digest)
		if err != nil {
			t.Fatal(err)
		}
		c1, _ := img.ConfigName()
		c2, _ := oimg.ConfigName()
		if c1 != c2 {
			t.Errorf("manifest.json and index.json disagree: config %s vs %s", c1, c2)
		}
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Architecture != runtime.GOARCH || cfg.OS != "linux" {
		t.Errorf("platform %s/%s", cfg.OS, cfg.Architecture)
	}
	if got := cfg.Config.Labels["org.opencontainers.image.version"]; got != version {
		t.Errorf("label version %q, want %s", got, version)
	}
	if got := cfg.Config.Labels["org.opencontainers.image.source"]; !strings.HasPrefix(got, "https://github.com/kvroute/") {
		t.Errorf("label source %q", got)
	}
	root := t.TempDir()
	rc := mutate.Extract(img)
	defer rc.Close()
	if err := extract(tar.NewReader(rc), root); err != nil {
		t.Fatalf("extract %s: %v", path, err)
	}
	return unpacked{root: root, cfg: cfg}
}

func untar(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return extract(tar.NewReader(f), dir)
}

func extract(tr *tar.Reader, dir string) error {
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
			if err := os.Chmod(p, os.FileMode(h.Mode)&os.ModePerm|modeBits(h.Mode)); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&os.ModePerm)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			f.Close()
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			os.Remove(p)
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		case tar.TypeLink:
			os.Remove(p)
			if err := os.Link(filepath.Join(dir, filepath.Clean("/"+h.Linkname)), p); err != nil {
				return err
			}
		}
	}
}

func modeBits(m int64) os.FileMode {
	var b os.FileMode
	if m&0o1000 != 0 {
		b |= os.ModeSticky
	}
	return b
}

// chrootCmd runs the image's entrypoint with args inside root, as the image's user.
func (u unpacked) cmd(ctx context.Context, t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	if u.cfg.Config.User == "" || strings.HasPrefix(u.cfg.Config.User, "0") || strings.HasPrefix(u.cfg.Config.User, "root") {
		t.Fatalf("image runs as %q, want a non-root user", u.cfg.Config.User)
	}
	uid, gid, _ := strings.Cut(u.cfg.Config.User, ":")
	nu, err1 := strconv.Atoi(uid)
	ng, err2 := strconv.Atoi(gid)
	if err1 != nil || err2 != nil {
		t.Fatalf("user %q: want numeric UID:GID", u.cfg.Config.User)
	}
	ep := u.cfg.Config.Entrypoint
	if len(ep) == 0 {
		t.Fatal("no entrypoint")
	}
	c := exec.CommandContext(ctx, ep[0], append(ep[1:], args...)...)
	c.Env = u.cfg.Config.Env
	c.Dir = "/"
	c.SysProcAttr = &syscall.SysProcAttr{Chroot: u.root, Credential: &syscall.Credential{Uid: uint32(nu), Gid: uint32(ng)}}
	// exec resolves Path on the host before chroot; make it the in-image path.
	c.Path = ep[0]
	return c
}

func TestHelpUnderChroot(t *testing.T) {
	need(t)
	for _, tc := range []struct{ name, want string }{
		{"manager", "default-router-image"},
		{"kvrouter", "-listen"},
		{"vllm-sim", "-kv-events-port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := unpack(t, tc.name)
			if _, err := os.Stat(filepath.Join(u.root, "etc/passwd")); err != nil {
				t.Fatal("no /etc/passwd")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := u.cmd(ctx, t, "--help").CombinedOutput()
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("%s --help under chroot (%v):\n%s", tc.name, err, out)
			}
			var ee *exec.ExitError
			if err != nil && (!errors.As(err, &ee) || ee.ExitCode() > 2) {
				t.Fatalf("%s --help: %v\n%s", tc.name, err, out)
			}
		})
	}
}

// The engine Deployment runs `vllm serve ...` in the vllm-sim image (its command replaces the
// entrypoint): /usr/local/bin/vllm must be there and dispatch to vllm-sim's vLLM command line.
func TestVLLMServeUnderChroot(t *testing.T) {
	need(t)
	u := unpack(t, "vllm-sim")
	if dst, err := os.Readlink(filepath.Join(u.root, "usr/local/bin/vllm")); err != nil || dst != "vllm-sim" {
		t.Fatalf("/usr/local/bin/vllm: link to %q, %v; want a link to vllm-sim", dst, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := u.cmd(ctx, t, "serve", "--help")
	c.Path, c.Args = "/usr/local/bin/vllm", []string{"vllm", "serve", "--help"}
	out, err := c.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "usage: vllm serve MODEL") {
		t.Fatalf("vllm serve --help under chroot (%v):\n%s", err, out)
	}

	// The engine command rendered for config/samples' sim sample, as the image's user, on free
	// ports: it serves, binds every rank's event and replay port, and answers a completion.
	b, err := os.ReadFile(filepath.Join(root, "config/samples/serving_v1alpha1_kvroutedmodel_sim.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := validation.New()
	if err != nil {
		t.Fatal(err)
	}
	m, err := v.Admit(ctx, b, "default")
	if err != nil {
		t.Fatal(err)
	}
	taken := map[int]bool{}
	port, events, replay := int32(testkit.FreeRun(t, 1, taken)), int32(testkit.FreeRun(t, 2, taken)), int32(testkit.FreeRun(t, 2, taken))
	m.Spec.Engine.Port, m.Spec.Engine.KVEvents.BasePort, m.Spec.Engine.KVEvents.ReplayBasePort = port, events, &replay
	d, err := render.EngineDeployment(m, render.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctr := d.Spec.Template.Spec.Containers[0]
	c = u.cmd(ctx, t)
	c.Path, c.Args = "/usr/local/bin/"+ctr.Command[0], append(slices.Clone(ctr.Command), ctr.Args...)
	c.Env = append(c.Env, "POD_IP=127.0.0.1")
	for _, e := range ctr.Env {
		if e.ValueFrom == nil && e.Name != "HOME" { // HOME is the pod's emptyDir
			c.Env = append(c.Env, e.Name+"="+e.Value)
		}
	}
	var log testkit.LockedBuffer
	c.Stdout, c.Stderr = &log, &log
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	testkit.Eventually(t, 20*time.Second, "the rendered engine command under chroot to serve", func() error {
		resp, err := http.Get(base + "/health")
		if err != nil {
			return fmt.Errorf("%v\n%s", err, log.String())
		}
		resp.Body.Close()
		return nil
	})
	want := fmt.Sprintf("events [tcp://0.0.0.0:%d tcp://0.0.0.0:%d], replay [tcp://0.0.0.0:%d tcp://0.0.0.0:%d]", events, events+1, replay, replay+1)
	if !strings.Contains(log.String(), want) {
		t.Errorf("start-up line lacks %q:\n%s", want, log.String())
	}
	resp, err := http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"`+m.Spec.Model.Name+`","prompt":"hello from the image","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "cached_tokens") {
		t.Fatalf("completion: %d %s\n%s", resp.StatusCode, body, log.String())
	}
}

func TestBundleImage(t *testing.T) {
	need(t)
	u := unpack(t, "bundle")
	for _, p := range []string{"manifests", "metadata/annotations.yaml", "tests/scorecard/config.yaml"} {
		if _, err := os.Stat(filepath.Join(u.root, p)); err != nil {
			t.Errorf("bundle image lacks /%s", p)
		}
	}
	if u.cfg.Config.Labels["operators.operatorframework.io.bundle.mediatype.v1"] != "registry+v1" {
		t.Errorf("bundle labels: %v", u.cfg.Config.Labels)
	}
}

// listeningAPI is the API address in kvrouter's JSON "kvrouter listening" line, "" before it.
func listeningAPI(log string) string {
	for _, line := range strings.Split(log, "\n") {
		var rec struct{ Msg, API string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "kvrouter listening" {
			return rec.API
		}
	}
	return ""
}

// kvrouter from its image routes a completion to vllm-sim from its image, over HTTP and ZMQ.
// Both listen on ports the kernel picks and report them in their logs.
func TestRouteUnderChroot(t *testing.T) {
	need(t)
	sim, router := unpack(t, "vllm-sim"), unpack(t, "kvrouter")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := simproc.StartCmd(ctx, sim.cmd(ctx, t, "--host", "127.0.0.1", "--model", "m"), simproc.Options{Name: "vllm-sim (image)"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	eng := "sim=" + s.URL + ";events=" + strings.Join(s.Events, ",") + ";replay=" + strings.Join(s.Replay, ",")
	var routerLog testkit.LockedBuffer
	r := router.cmd(ctx, t, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "json", "--engine", eng)
	r.Stdout, r.Stderr = &routerLog, &routerLog
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	var routerErr error
	routerDone := make(chan struct{})
	go func() { routerErr = r.Wait(); close(routerDone) }()
	defer func() { _ = r.Process.Kill(); <-routerDone }()
	base := ""
	for deadline := time.Now().Add(30 * time.Second); ; {
		if base == "" {
			if api := listeningAPI(routerLog.String()); api != "" {
				base = "http://" + api
			}
		}
		if base != "" {
			resp, err := http.Get(base + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
		}
		select {
		case <-routerDone:
			t.Fatalf("kvrouter exited (%v)\nkvrouter:\n%s\nvllm-sim:\n%s", routerErr, routerLog.String(), s.Output())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvrouter never ready\nkvrouter:\n%s\nvllm-sim:\n%s", routerLog.String(), s.Output())
		}
	}
	resp, err := http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":"hello from an image","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var out struct {
		Choices []json.RawMessage `json:"choices"`
	}
	if resp.StatusCode != 200 || resp.Header.Get("x-kvroute-engine") != "sim" || json.Unmarshal(body, &out) != nil || len(out.Choices) == 0 {
		t.Fatalf("%d engine=%q %s\nkvrouter:\n%s\nvllm-sim:\n%s", resp.StatusCode, resp.Header.Get("x-kvroute-engine"), body, routerLog.String(), s.Output())
	}
}

// The fast subset: the base and runtime layers make a self-contained image for a cgo binary
// that links libzmq, as kvrouter and vllm-sim do.
func TestRuntimeLayerUnderChroot(t *testing.T) {
	if !canChroot {
		t.Skip(skipReason)
	}
	dir := t.TempDir()
	run := func(name string, args ...string) string {
		t.Helper()
		c := exec.Command(name, args...)
		c.Dir = root
		c.Env = append(os.Environ(), "CGO_ENABLED=1")
		out, err := c.Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr)
		}
		return string(out)
	}
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	run(goBin, "build", "-o", filepath.Join(dir, "zmqcheck"), "./test/images/zmqcheck")
	run(goBin, "build", "-o", filepath.Join(dir, "ociimage"), "./hack/ociimage")
	run("hack/image-base.sh", filepath.Join(dir, "base"))
	run("hack/debian-runtime.sh", filepath.Join(dir, "runtime"), "libzmq5")
	const v = "v0.0.0-fast"
	tarPath := filepath.Join(dir, "zmqcheck.tar")
	assemble := func(out string) string {
		line := run(filepath.Join(dir, "ociimage"), "--out", out, "--tag", "kvroute.test/zmqcheck:"+v,
			"--layer", filepath.Join(dir, "base")+"=/", "--owner", "/home/nonroot=65532:65532",
			"--layer", filepath.Join(dir, "runtime")+"=/",
			"--layer", filepath.Join(dir, "zmqcheck")+"=/usr/local/bin/zmqcheck",
			"--user", "65532:65532", "--entrypoint", "/usr/local/bin/zmqcheck",
			"--label", "org.opencontainers.image.version="+v, "--label", "org.opencontainers.image.source=https://github.com/kvroute/kvroute")
		f := strings.Fields(line)
		if len(f) != 3 || !strings.HasPrefix(f[2], "sha256:") {
			t.Fatalf("ociimage printed %q", line)
		}
		return f[2]
	}
	// Reproducible: the same inputs give the same image digest.
	if d1, d2 := assemble(tarPath), assemble(filepath.Join(dir, "again.tar")); d1 != d2 {
		t.Errorf("two assemblies of the same inputs: %s and %s", d1, d2)
	}
	u := unpackPath(t, tarPath, v)
	if fi, err := os.Stat(filepath.Join(u.root, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("/tmp is not 1777: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(u.root, "etc/ssl/certs/ca-certificates.crt")); err != nil || fi.Size() < 10000 {
		t.Errorf("no CA bundle: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := u.cmd(ctx, t).CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "libzmq 4.") {
		t.Fatalf("zmqcheck under chroot: %v\n%s", err, out)
	}
	t.Logf("%s", bytes.TrimSpace(out))
}
