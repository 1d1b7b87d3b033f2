package main

import (
	"os/exec"
	"strings"
	"testing"
)

// kvrouter offers the production policies only: no package it is built from lives under sim/,
// where kvbench's benchmark policies (sim/policies) are, so nothing can register them.
func TestTheRouterIsBuiltWithoutSimulationCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	pkgs := strings.Fields(string(out))
	if len(pkgs) < 10 {
		t.Fatalf("go list -deps listed %d packages: %q", len(pkgs), out)
	}
	for _, p := range pkgs {
		if strings.HasPrefix(p, "github.com/kvroute/kvroute/sim/") {
			t.Errorf("kvrouter is built from %s", p)
		}
	}
}
