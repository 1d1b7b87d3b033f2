package cli

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/doccheck"
	"github.com/kvroute/kvroute/internal/version"
)

func TestVersionHelpAndUsageErrors(t *testing.T) {
	var out bytes.Buffer
	saved := versionOut
	versionOut = &out
	t.Cleanup(func() { versionOut = saved })
	var stderr bytes.Buffer
	if code := Run(context.Background(), []string{"--version"}, &stderr, Options{}); code != 0 ||
		!strings.HasPrefix(out.String(), "kvrouter ") || !strings.Contains(out.String(), runtime.Version()) {
		t.Errorf("--version: exit %d, stdout %q, stderr %q", code, out.String(), stderr.String())
	}
	stderr.Reset()
	if code := Run(context.Background(), []string{"--help"}, &stderr, Options{}); code != 0 {
		t.Errorf("--help: exit %d", code)
	}
	help := stderr.String()
	// Grouped by task, every flag in a group, an example at the end.
	last := 0
	for _, g := range []string{"\nAPI:\n", "\nEngines:\n", "\nPolicy:\n", "\nObservability:\n", "\nExample"} {
		i := strings.Index(help, g)
		if i < last {
			t.Errorf("usage lacks %q after offset %d:\n%s", g, last, help)
		}
		last = i
	}
	if strings.Contains(help, "Other flags") {
		t.Errorf("a flag is in no group:\n%s", help)
	}
	for _, args := range [][]string{{"--no-such-flag"}, {"stray"}, {"--access-log-sample", "-1", "--engine", "a=http://127.0.0.1:1"}} {
		stderr.Reset()
		if code := Run(context.Background(), args, &stderr, Options{}); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, stderr.String())
		}
	}
}

// Every flag is in router.md's flag table, and every kvrouter flag the docs name exists.
func TestFlagsMatchDocs(t *testing.T) {
	var stderr bytes.Buffer
	Run(context.Background(), []string{"--help"}, &stderr, Options{})
	flags := doccheck.HelpFlags(stderr.String())
	doccheck.Check(t, "../..", "kvrouter", flags)
	doccheck.InTable(t, "../..", "kvrouter", flags)
}

// The running router's /metrics says which build it is.
func TestBuildInfoOnMetrics(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan [2]string, 1)
	done := make(chan int, 1)
	var logs syncBuf
	go func() {
		done <- Run(ctx, []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--no-events",
			"--engine", "e0=http://127.0.0.1:1"}, &logs, Options{Ready: func(a, b string) { addrs <- [2]string{a, b} }})
	}()
	var a [2]string
	select {
	case a = <-addrs:
	case code := <-done:
		t.Fatalf("exited %d: %s", code, logs.String())
	}
	defer func() {
		cancel()
		<-done
	}()
	resp, err := http.Get("http://" + a[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	i := version.Get()
	want := `kvroute_build_info{commit="` + i.Commit + `",goversion="` + i.GoVersion + `",version="` + i.Version + `"} 1`
	if !strings.Contains(string(body), want) {
		t.Errorf("/metrics lacks %s", want)
	}
}
