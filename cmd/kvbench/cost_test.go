package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/sim/routercost"
)

// The smallest cost run, through kvbench's router (this test binary, TestMain) and a real
// vllm-sim: every measurement comes back with figures a real run has, and the table shows them.
func TestCostMeasuresTheRouter(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an engine and a router")
	}
	binDir := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, "vllm-sim"), "../vllm-sim").CombinedOutput(); err != nil {
		t.Fatalf("go build vllm-sim: %v\n%s", err, out)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	figs, err := routercost.Run(ctx, routercost.Options{
		SimBin: filepath.Join(binDir, "vllm-sim"), Routers: []routercost.Router{{Name: "test", Bin: self, Args: []string{"router"}}},
		Policies: []string{"kv", "round-robin"}, Modes: []string{routercost.ModeProxy, routercost.ModePicker}, CPUSizes: []int{64, 512}, CPURequests: 3, TTFTSizes: []int{256}, TTFTPairs: 3,
		StreamTokens: 128, Streams: 4, StreamRequests: 12, MaxTokens: 4, Dir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(figs) != 4 {
		t.Fatalf("%d measurements, want one a policy and mode", len(figs))
	}
	for _, f := range figs {
		if len(f.CPU) != 2 || f.CPU[0].RouterMs <= 0 || f.CPU[0].EngineMs <= 0 || f.CPU[1].PromptTokens != 512 {
			t.Errorf("%s: cpu %+v", f.Policy, f.CPU)
		}
		if len(f.TTFT) != 1 || f.TTFT[0].Pairs != 3 || f.TTFT[0].DirectP50Ms <= 0 || f.TTFT[0].RoutedP50Ms <= 0 {
			t.Errorf("%s: ttft %+v", f.Policy, f.TTFT)
		}
		if picker := f.Mode == routercost.ModePicker; len(f.TTFT) == 1 && picker != (f.TTFT[0].PickP50Ms > 0) {
			t.Errorf("%s %s mode: pick round trip %v ms (measured in picker mode only)", f.Policy, f.Mode, f.TTFT[0].PickP50Ms)
		}
		if s := f.Streams; s == nil || s.Failed != 0 || s.DirectRPS <= 0 || s.RoutedRPS <= 0 || s.Ratio <= 0 {
			t.Errorf("%s: streams %+v", f.Policy, s)
		}
	}
	var b strings.Builder
	if err := writeCostTable(&b, figs); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
	for _, want := range []string{"512 tok", "test    round-robin  picker", "test    kv           proxy", "picker round trip", "4 concurrent streams of 128 tokens"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
