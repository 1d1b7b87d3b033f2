package version

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Pkg is the import path the link flags name; Makefile, Dockerfiles and hack/images.sh use it.
const pkg = "github.com/kvroute/kvroute/internal/version"

func TestResolveOrder(t *testing.T) {
	vcs := &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2026-12-01T10:00:00Z"},
		{Key: "vcs.modified", Value: "true"}}}
	for _, c := range []struct {
		name    string
		v, c, d string
		bi      *debug.BuildInfo
		want    Info
	}{
		{"stamped wins", "v0.2.0-3-gabc", "abc", "2026-12-07T00:00:00Z", vcs,
			Info{"v0.2.0-3-gabc", "abc", "2026-12-07T00:00:00Z", "go1.99"}},
		{"vcs record", "", "", "", vcs,
			Info{"0123456789ab-dirty", "0123456789abcdef0123", "2026-12-01T10:00:00Z", "go1.99"}},
		{"module version", "", "", "", &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Version: "v0.1.0"}},
			Info{"v0.1.0", Unknown, Unknown, "go1.99"}},
		{"image version only", "v0.1.0", "", "", &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Version: "(devel)"}},
			Info{"v0.1.0", Unknown, Unknown, "go1.99"}},
		{"nothing", "", "", "", nil, Info{Unknown, Unknown, Unknown, runtime.Version()}},
	} {
		if got := resolve(c.v, c.c, c.d, c.bi); got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestCollector(t *testing.T) {
	r := prometheus.NewRegistry()
	r.MustRegister(Collector())
	i := Get()
	want := `# HELP kvroute_build_info Always 1; the labels say which kvroute build is running.
# TYPE kvroute_build_info gauge
kvroute_build_info{commit="` + i.Commit + `",goversion="` + i.GoVersion + `",version="` + i.Version + `"} 1
`
	if err := testutil.GatherAndCompare(r, strings.NewReader(want), "kvroute_build_info"); err != nil {
		t.Error(err)
	}
}

// The variables the build scripts set exist under the names they use: a binary linked with
// those -X flags prints them.
func TestLinkFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	bin := filepath.Join(t.TempDir(), "printversion")
	ld := "-X " + pkg + ".version=v9.9.9-test -X " + pkg + ".commit=c0ffee -X " + pkg + ".date=2026-12-07T12:00:00Z"
	build := exec.Command("go", "build", "-ldflags", ld, "-o", bin, "./testdata/printversion")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := "printversion v9.9.9-test (commit c0ffee, built 2026-12-07T12:00:00Z, " + runtime.Version() + ")\n"
	if string(out) != want {
		t.Errorf("got %q, want %q", out, want)
	}
}

// Every build script stamps the three variables through this package's path.
func TestBuildScriptsStamp(t *testing.T) {
	root := "../.."
	for _, f := range []string{"Makefile", "Dockerfile", "Dockerfile.kvrouter", "Dockerfile.vllm-sim"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []string{"version", "commit", "date"} {
			if !strings.Contains(string(b), "-X "+pkg+"."+v+"=") {
				t.Errorf("%s does not set %s.%s", f, pkg, v)
			}
		}
	}
}
