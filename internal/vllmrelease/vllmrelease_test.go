package vllmrelease

import "testing"

// The flag list follows the pinned release: moving Tested[0] without reading the new release's
// CLI again fails here.
func TestFlagsFollowThePin(t *testing.T) {
	if FlagsTag != Tested[0].Tag {
		t.Fatalf("FlagsTag %s, pinned release %s: re-read arg_utils.py and cli_args.py at the pin", FlagsTag, Tested[0].Tag)
	}
	if DefaultImage() != "vllm/vllm-openai:"+Tested[0].Tag {
		t.Fatalf("DefaultImage %s", DefaultImage())
	}
}

func TestFlagsAreOneEach(t *testing.T) {
	names, aliases := map[string]bool{}, map[string]bool{}
	for _, f := range Flags {
		if f.Name == "" || f.Name[0] == '-' || names[f.Name] {
			t.Errorf("flag %q empty, dashed or twice", f.Name)
		}
		names[f.Name] = true
		for _, a := range f.Aliases {
			if aliases[a] {
				t.Errorf("alias -%s twice", a)
			}
			aliases[a] = true
		}
	}
	for _, c := range []struct {
		name    string
		found   bool
		negated bool
		arity   Arity
	}{
		{"enable-prefix-caching", true, false, BoolOpt},
		{"no-enable-prefix-caching", true, true, BoolOpt},
		{"no-headless", false, false, 0}, // store_true has no --no- form
		{"headless", true, false, StoreTrue},
		{"api-key", true, false, List},
		{"kv-events-config", true, false, One},
		{"gpu-memory-utilisation", false, false, 0},
	} {
		f, neg := Lookup(c.name)
		if (f != nil) != c.found || neg != c.negated || (f != nil && f.Arity != c.arity) {
			t.Errorf("Lookup(%q) = %+v, %v", c.name, f, neg)
		}
	}
	if f := Short("tp"); f == nil || f.Name != "tensor-parallel-size" {
		t.Errorf("Short(tp) = %+v", f)
	}
}

func TestBindsEndpoint(t *testing.T) {
	for ep, want := range map[string]bool{
		"tcp://*:5557": true, "tcp://[::]:5557": true, "ipc:///tmp/kv": true, "inproc://kv": true,
		"tcp://router-events.ns.svc:5557": false, "tcp://10.0.0.1:5557": false,
	} {
		if got := BindsEndpoint(ep); got != want {
			t.Errorf("BindsEndpoint(%q) = %v, want %v", ep, got, want)
		}
	}
}
