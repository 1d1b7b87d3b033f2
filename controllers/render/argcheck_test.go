package render_test

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/internal/vllmrelease"
)

func TestCheckEngineArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want map[int]string // index -> suggestion ("" for none)
	}{
		{args: []string{"--max-model-len", "4096", "--gpu-memory-utilization=0.85", "--enforce-eager"}},
		{args: []string{"--max_model_len=4096", "--no-enable-chunked-prefill", "-q", "awq", "-O3", "--compilation-config.level", "3"}},
		{args: []string{"--kv-cache-dtype", "fp8", "--speculative-config", `{"method":"ngram"}`, "--seed", "-1"}},
		{args: []string{"--kv-offloading-size", "8", "-ep", "--attention-backend=FLASHINFER", "--no-kv-cache-metrics"}},
		{args: []string{"--gpu-memory-utilisation", "0.9"}, want: map[int]string{0: "--gpu-memory-utilization"}},
		{args: []string{"--max-model-length=8192"}, want: map[int]string{0: "--max-model-len"}},
		{args: []string{"--enable-prefix-cacheing"}, want: map[int]string{0: "--enable-prefix-caching"}},
		{args: []string{"--no-max-model-len"}, want: map[int]string{0: "--max-model-len"}},
		{args: []string{"--swap-space", "4", "--frobnicate-the-gpus"}, want: map[int]string{2: ""}},
		{args: []string{"-tpx", "2"}, want: map[int]string{0: "-tp"}},
	} {
		got := render.CheckEngineArgs(tc.args)
		if len(got) != len(tc.want) {
			t.Errorf("%q: warnings %v, want %v", tc.args, got, tc.want)
			continue
		}
		for _, w := range got {
			s, ok := tc.want[w.Index]
			if !ok || w.Suggestion != s || w.Arg != tc.args[w.Index] {
				t.Errorf("%q: warning %+v, want index %d suggesting %q", tc.args, w, w.Index, s)
			}
		}
	}
}

func TestArgWarningNamesTheFlagTheReleaseAndTheFix(t *testing.T) {
	w := render.CheckEngineArgs([]string{"--gpu-memory-utilisation=0.9"})
	if len(w) != 1 {
		t.Fatalf("warnings %v", w)
	}
	msg := w[0].String()
	for _, want := range []string{`spec.engine.args[0] "--gpu-memory-utilisation=0.9"`, vllmrelease.FlagsTag, "did you mean --gpu-memory-utilization?"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q lacks %q", msg, want)
		}
	}
}

// TestEveryFlagTheOperatorWritesIsKnown: the operator's own command line, and each sample's
// args, pass the check of the sample's engine kind.
func TestEveryFlagTheOperatorWritesIsKnown(t *testing.T) {
	for _, shape := range shapes {
		m := sample(t, shape)
		args, err := render.EngineArgs(m)
		if err != nil {
			t.Fatal(err)
		}
		if w := render.CheckEngineArgsFor(render.EngineKind(m), args); len(w) != 0 {
			t.Errorf("%s: %v", shape, w)
		}
	}
}
