package app

import (
	"testing"

	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// /debug/engines shows each engine's pool as discovery reported it (the operator's role label
// on a disaggregated model's pods), and nothing for an aggregated engine.
func TestDebugEnginesShowRole(t *testing.T) {
	f := startFleet(t, 3, vllmsim.Config{})
	es := f.engines()
	es[0].Role, es[1].Role = config.RolePrefill, config.RoleDecode
	rt := startRouter(t, discovery.NewStatic(es), nil)
	rt.waitStreams(t, "exact")
	got := map[string]string{}
	for _, e := range rt.s.Engines() {
		got[e.Name] = e.Role
	}
	want := map[string]string{es[0].Name: config.RolePrefill, es[1].Name: config.RoleDecode, es[2].Name: ""}
	for n, r := range want {
		if got[n] != r {
			t.Errorf("engine %s: role %q, want %q (all: %v)", n, got[n], r, got)
		}
	}
}
