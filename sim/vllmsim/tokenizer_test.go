package vllmsim

import (
	"testing"
	"unicode/utf8"
)

func TestTokenizerRoundTrip(t *testing.T) {
	for _, text := range []string{"", "a", "ab", "hello world", "<|im_start|>user\nhé<|im_end|>\n",
		"<|id_70000|><|id_65791|>", "<|not a marker|>", "<|", "<|>", "<||>", "日本語"} {
		ids := Tokenize(text)
		if err := checkVocab(ids); err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		back, err := Detokenize(ids)
		if err != nil || back != text {
			t.Errorf("%q -> %v -> %q (%v)", text, ids, back, err)
		}
	}
	if ids := Tokenize("<|im_start|>"); len(ids) != 1 || ids[0] != tokImStart {
		t.Errorf("special marker tokenized as %v", ids)
	}
	// <|id_65791|> is a byte-pair id, not an opaque one: it stays text.
	if ids := Tokenize("<|id_65791|>"); len(ids) == 1 {
		t.Errorf("pair id accepted as opaque marker: %v", ids)
	}
	// Every id in the vocabulary detokenizes and re-tokenizes to itself on its own.
	for _, id := range []uint32{0, 255, 256, 65791, 65792, 100000, tokEndOfText, tokImEnd, VocabSize - 1} {
		s, err := TokenString(id)
		if err != nil {
			t.Fatal(err)
		}
		if got := Tokenize(s); len(got) != 1 || got[0] != id {
			t.Errorf("id %d -> %q -> %v", id, s, got)
		}
	}
	if _, err := TokenString(VocabSize); err == nil {
		t.Error("id VocabSize accepted")
	}
}

func TestOutputTokensAreText(t *testing.T) {
	for i := range 200 {
		s, _ := TokenString(outputToken(12345, i))
		if len(s) != 2 || !utf8.ValidString(s) {
			t.Fatalf("output token %d is %q", i, s)
		}
	}
}

func FuzzTokenizeRoundTrip(f *testing.F) {
	for _, s := range []string{"hello", "<|im_start|>x<|im_end|>", "<|id_99999|>", "\xff\xfe"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		ids := Tokenize(text)
		if err := checkVocab(ids); err != nil {
			t.Fatal(err)
		}
		back, err := Detokenize(ids)
		if err != nil || back != text {
			t.Fatalf("%q -> %q (%v)", text, back, err)
		}
	})
}

func FuzzParsePrompts(f *testing.F) {
	for _, s := range []string{`"x"`, `[1,2]`, `[[1],[2,3]]`, `["a","b"]`, `[-1]`, `{}`, `null`, `[[]]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		ps, err := parsePrompts(raw)
		if err != nil {
			return
		}
		for _, p := range ps {
			if checkVocab(p) != nil {
				t.Fatalf("accepted out-of-vocabulary ids from %q", raw)
			}
		}
	})
}
