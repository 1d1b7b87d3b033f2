package main

import (
	"bytes"
	"flag"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/klog/v2"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/kvroute/kvroute/internal/doccheck"
)

func TestExitCodes(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		out  string // in stdout
		err  string // in stderr
	}{
		{[]string{"--version"}, 0, "manager ", ""},
		{[]string{"--help"}, 0, "", "-leader-elect"},
		{[]string{"-h"}, 0, "", "-default-engine-image"},
		{[]string{"--no-such-flag"}, 2, "", "manager:"},
		{[]string{"extra"}, 2, "", "unexpected arguments"},
		{[]string{"--default-engine-image", ""}, 2, "", "must not be empty"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(c.args, &stdout, &stderr)
		if code != c.code || !strings.Contains(stdout.String(), c.out) || !strings.Contains(stderr.String(), c.err) {
			t.Errorf("%v: exit %d (want %d), stdout %q, stderr %q", c.args, code, c.code, stdout.String(), stderr.String())
		}
	}
}

// The manager registers kvroute_build_info on controller-runtime's registry, which its metrics
// server serves, before it needs a cluster.
func TestBuildInfoOnMetricsRegistry(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	var stderr bytes.Buffer
	if code := run([]string{"--metrics-bind-address", "0", "--health-probe-bind-address", "0"}, &bytes.Buffer{}, &stderr); code != 1 ||
		!strings.Contains(stderr.String(), "kubeconfig") {
		t.Fatalf("without a cluster: exit %d, %q", code, stderr.String())
	}
	n, err := testutil.GatherAndCount(ctrlmetrics.Registry, "kvroute_build_info")
	if err != nil || n != 1 {
		t.Errorf("kvroute_build_info series: %d (%v)", n, err)
	}
}

// Every manager flag is in operator.md's flag table but klog's, which it names as a set.
func TestFlagsMatchDocs(t *testing.T) {
	var stderr bytes.Buffer
	run([]string{"--help"}, &bytes.Buffer{}, &stderr)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	var own []string
	for _, f := range doccheck.HelpFlags(stderr.String()) {
		if klogFlags.Lookup(f) == nil {
			own = append(own, f)
		}
	}
	doccheck.Check(t, "../..", "manager", own)
	doccheck.InTable(t, "../..", "manager", own)
}
