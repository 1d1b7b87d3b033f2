package engine

import "testing"

func TestParse(t *testing.T) {
	for in, want := range map[string]Kind{"": VLLM, "vllm": VLLM, "SGLang": SGLang, " trtllm ": TRTLLM} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := Parse("tgi"); err == nil {
		t.Error("Parse(tgi) accepted an unknown engine")
	}
}

func TestProfiles(t *testing.T) {
	v := VLLM.Profile()
	if !v.HashParity || !v.ReportMode || len(v.NotApplicable) != 0 || !v.CanTokenize(true) {
		t.Errorf("vLLM profile %+v: every check applies and chat renders", v)
	}
	if Kind("").Profile().Kind != VLLM {
		t.Error("an unset kind is not vLLM's profile")
	}
	s := SGLang.Profile()
	if s.HashParity || s.ReportMode || s.CanTokenize(true) || !s.CanTokenize(false) || len(s.NotApplicable) == 0 {
		t.Errorf("SGLang profile %+v: no parity, no report mode, text tokenize only, reasons listed", s)
	}
	tr := TRTLLM.Profile()
	if !tr.CanTokenize(false) || tr.CanTokenize(true) || tr.TokenizePath != "/_internal/tokenize" || tr.Metrics.Path != "/prometheus/metrics" {
		t.Errorf("TensorRT-LLM profile %+v: text through /_internal/tokenize only, metrics on /prometheus/metrics", tr)
	}
}
