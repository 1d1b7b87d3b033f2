package server

import (
	"os/exec"
	"strings"
	"testing"
)

// The HTTP surface stays HTTP: it must not reach, directly or through another package, the
// event pipeline, the index, the scoring package or the key derivation. Routing lives in
// router/app and the packages it wires.
func TestServerImportsNoRoutingMachinery(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed %d packages: %v", len(deps), deps)
	}
	const mod = "github.com/kvroute/kvroute/"
	forbidden := map[string]bool{}
	for _, p := range []string{"router/kvevents", "router/index", "router/score", "router/blockkey"} {
		forbidden[mod+p] = true
	}
	found := false
	for _, d := range deps {
		if d == mod+"router/server" {
			found = true
		}
		if forbidden[d] {
			t.Errorf("router/server depends on %s", strings.TrimPrefix(d, mod))
		}
	}
	if !found {
		t.Fatalf("go list -deps did not list router/server itself: %v", deps)
	}
}
