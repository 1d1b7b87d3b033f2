package blockkey

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
)

// Expected bytes below are worked out by hand from CPython's pickle opcodes and RFC 8949 (spec
// §2.7), independent of the vectors file.

func TestPickleInt(t *testing.T) {
	cases := map[int64]string{
		0:           "4b00",
		255:         "4bff",
		256:         "4d0001",
		65535:       "4dffff",
		65536:       "4a00000100",
		-1:          "4affffffff",
		-12:         "4af4ffffff",
		2147483647:  "4affffff7f",
		-2147483648: "4a00000080",
		2147483648:  "8a050000008000",
		4294967295:  "8a05ffffffff00",
		-2147483649: "8a05ffffff7fff",
		1 << 62:     "8a080000000000000040",
	}
	for v, want := range cases {
		if got := hex.EncodeToString(appendPickleInt(nil, v)); got != want {
			t.Errorf("pickle int %d = %s, want %s", v, got, want)
		}
	}
}

func TestPickleExtrasSpecExamples(t *testing.T) {
	parent := bytes.Repeat([]byte{0xab}, 32)
	tokens := make([]uint32, 16)
	plain, err := appendPickleBlock(nil, parent, tokens, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		extras  Extras
		replace string // what takes the place of the None (4e) opcode
	}{
		{Extras{String("my-salt")}, "8c076d792d73616c74948594"},
		{Extras{MM("img-abc123", -12)}, "8c0a696d672d61626331323394" + "4af4ffffff869485" + "94"},
		{Extras{String("L"), MM("i", 4), String("S")}, "8c014c94" + "8c016994" + "4b04" + "8694" + "8c015394" + "8794"},
		{Extras{String("a"), String("b"), String("c"), String("d")}, "28" + "8c016194" + "8c016294" + "8c016394" + "8c016494" + "7494"},
		{Extras{{Kind: ExtraBytes, Bytes: []byte{1, 2}}}, "4302010294" + "8594"},
	} {
		want := c.replace
		got, err := appendPickleBlock(nil, parent, tokens, c.extras)
		if err != nil {
			t.Fatal(err)
		}
		none := bytes.LastIndexByte(plain, pkNone)
		wantBody := hex.EncodeToString(plain[11:none]) + want + hex.EncodeToString(plain[none+1:])
		if gotBody := hex.EncodeToString(got[11:]); gotBody != wantBody {
			t.Errorf("extras %v:\n got %s\nwant %s", c.extras, gotBody, wantBody)
		}
		if n := int(got[3]) | int(got[4])<<8; n != len(got)-11 {
			t.Errorf("extras %v: frame length %d, body %d", c.extras, n, len(got)-11)
		}
	}
}

func TestPickleSmallBodyIsNotFramed(t *testing.T) {
	got, err := appendPickleStr(nil, "")
	if err != nil {
		t.Fatal(err)
	}
	// "" is 8c 00 94 then STOP: 4 bytes, which CPython still frames (only < 4 is unframed).
	if want := "8005950400000000000000" + "8c00942e"; hex.EncodeToString(got) != want {
		t.Errorf("pickle '' = %x, want %s", got, want)
	}
	out, err := finishPickleFrame([]byte{pkProto, 5, pkFrame, 0, 0, 0, 0, 0, 0, 0, 0, pkNone, pkStop}, 0, 11)
	if err != nil || hex.EncodeToString(out) != "80054e2e" {
		t.Errorf("2-byte body framed: %x %v", out, err)
	}
}

func TestPickleRefusesMultiFrame(t *testing.T) {
	if _, err := appendPickleBlock(nil, make([]byte, 32), make([]uint32, 40000), nil); err == nil {
		t.Fatal("a 120 KiB block input was serialized; multi-frame output is not reproduced")
	}
}

func TestCBORExtras(t *testing.T) {
	var buf bytes.Buffer
	parent := bytes.Repeat([]byte{0xcd}, 16)
	err := appendCBORBlock(&buf, parent, []uint32{0, 23, 24, 255, 256, 65536}, Extras{String("L"), MM("i", -12), String("S")})
	if err != nil {
		t.Fatal(err)
	}
	want := "83" + "50" + strings.Repeat("cd", 16) +
		"86" + "00" + "17" + "1818" + "18ff" + "190100" + "1a00010000" +
		"83" + "614c" + "82" + "6169" + "2b" + "6153"
	if got := hex.EncodeToString(buf.Bytes()); got != want {
		t.Errorf("cbor\n got %s\nwant %s", got, want)
	}
}

func TestEngineRejectsUnknownExtra(t *testing.T) {
	for _, algo := range Algos {
		h, err := NewEngineHasher(algo, "0")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.HashBlock(nil, nil, []uint32{1}, Extras{{Kind: ExtraOther, Bytes: []byte{0xc0}}}); err == nil {
			t.Errorf("%s hashed an extra key it cannot reproduce", algo)
		}
	}
	if _, err := ParseAlgo("builtin"); err == nil {
		t.Error("ParseAlgo accepted builtin")
	}
	if _, err := NewEngineHasher("md5", "0"); err == nil {
		t.Error("NewEngineHasher accepted md5")
	}
}

func TestHashPromptChainsAndLoRA(t *testing.T) {
	h, err := NewEngineHasher(AlgoSHA256, "0")
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]uint32, 40) // two full blocks and a partial one
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	base, err := h.HashPrompt(tokens, 16, Identity{})
	if err != nil {
		t.Fatal(err)
	}
	if len(base) != 2 {
		t.Fatalf("%d hashes for 40 tokens, want 2 (partial block is not hashed)", len(base))
	}
	b1, _ := h.HashBlock(nil, base[0], tokens[16:32], nil)
	if !bytes.Equal(b1, base[1]) {
		t.Error("block 1 is not hashed from block 0's full digest")
	}
	lora, err := h.HashPrompt(tokens, 16, Identity{LoRAName: "adapter"})
	if err != nil {
		t.Fatal(err)
	}
	l0, _ := h.HashBlock(nil, nil, tokens[:16], Extras{String("adapter")})
	l1, _ := h.HashBlock(nil, l0, tokens[16:32], Extras{String("adapter")})
	if !bytes.Equal(lora[0], l0) || !bytes.Equal(lora[1], l1) {
		t.Error("LoRA name is not an extra key on every block")
	}
	if _, err := h.HashPrompt(tokens, 0, Identity{}); err == nil {
		t.Error("block size 0 accepted")
	}
}
