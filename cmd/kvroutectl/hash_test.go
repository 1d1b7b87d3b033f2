package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const vectorsPath = "../../testdata/vllm/vllm-vectors.json"

type cliVectors struct {
	Params struct {
		Seed string `json:"PYTHONHASHSEED"`
	} `json:"params"`
	Sequences map[string]struct {
		Request struct {
			Tokens    []uint32 `json:"tokens"`
			CacheSalt string   `json:"cache_salt"`
		} `json:"request"`
		BlockSize int `json:"block_size"`
		Algos     map[string][]struct {
			HashHex string      `json:"hash_hex"`
			WireInt json.Number `json:"wire_int"`
		} `json:"algos"`
	} `json:"sequences"`
	KVEvents struct {
		Sets map[string][]struct {
			Label  string            `json:"label"`
			Frames map[string]string `json:"zmq_frames_hex"`
		} `json:"sets"`
	} `json:"kv_events"`
}

func loadCLIVectors(t *testing.T) cliVectors {
	t.Helper()
	raw, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v cliVectors
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func runCmd(t *testing.T, f func([]string, io.Reader, io.Writer, io.Writer) int, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	rc := f(args, strings.NewReader(stdin), &out, &errb)
	return rc, out.String(), errb.String()
}

type hashOut struct {
	NoneHashHex string `json:"none_hash_hex"`
	Blocks      []struct {
		Index     int          `json:"index"`
		HashHex   string       `json:"hash_hex"`
		WireInt   json.Number  `json:"wire_int"`
		RouterKey *json.Number `json:"router_key"`
	} `json:"blocks"`
}

func parseHashOut(t *testing.T, s string) hashOut {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var h hashOut
	if err := dec.Decode(&h); err != nil {
		t.Fatalf("output %q: %v", s, err)
	}
	return h
}

func joinTokens(ts []uint32) string {
	parts := make([]string, len(ts))
	for i, v := range ts {
		parts[i] = strconvU(v)
	}
	return strings.Join(parts, ",")
}

func TestHashMatchesEveryVector(t *testing.T) {
	v := loadCLIVectors(t)
	n := 0
	for name, seq := range v.Sequences {
		for algo, blocks := range seq.Algos {
			args := []string{"--algo", algo, "--seed", v.Params.Seed, "--block-size", strconvU(uint32(seq.BlockSize)), "--tokens", joinTokens(seq.Request.Tokens)}
			if seq.Request.CacheSalt != "" {
				args = append(args, "--cache-salt", seq.Request.CacheSalt)
			}
			rc, out, errs := runCmd(t, runHash, "", args...)
			if rc != 0 {
				t.Fatalf("%s/%s: rc %d: %s", name, algo, rc, errs)
			}
			h := parseHashOut(t, out)
			if len(h.Blocks) != len(blocks) {
				t.Fatalf("%s/%s: %d blocks, want %d", name, algo, len(h.Blocks), len(blocks))
			}
			for i, b := range blocks {
				// wire_int is compared as the JSON number's text: a float64 detour would change it.
				if h.Blocks[i].HashHex != b.HashHex || h.Blocks[i].WireInt != b.WireInt || h.Blocks[i].Index != i {
					t.Errorf("%s/%s block %d: %+v, want %s %s", name, algo, i, h.Blocks[i], b.HashHex, b.WireInt)
				}
				if h.Blocks[i].RouterKey != nil {
					t.Error("router_key printed without --router-key")
				}
				n++
			}
		}
	}
	if n == 0 {
		t.Fatal("no vectors")
	}
}

func TestHashTokensFileMMAndRouterKey(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tokens.json")
	if err := os.WriteFile(file, []byte("[1, 2, 3,\n4, 5, 6, 7, 8]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--block-size", "4", "--router-key", "--lora", "L"}
	rc, fromFile, errs := runCmd(t, runHash, "", append(base, "--tokens-file", file)...)
	if rc != 0 {
		t.Fatal(errs)
	}
	rc, fromFlag, _ := runCmd(t, runHash, "", append(base, "--tokens", "1,2,3,4,5,6,7,8")...)
	rc2, fromStdin, _ := runCmd(t, runHash, "1 2 3 4 5 6 7 8", append(base, "--tokens-file", "-")...)
	if rc != 0 || rc2 != 0 || fromFile != fromFlag || fromStdin != fromFlag {
		t.Fatalf("file, flag and stdin differ:\n%s\n%s\n%s", fromFile, fromFlag, fromStdin)
	}
	h := parseHashOut(t, fromFlag)
	if len(h.Blocks) != 2 || h.Blocks[0].RouterKey == nil || h.Blocks[1].RouterKey == nil {
		t.Fatalf("want 2 blocks with router keys: %s", fromFlag)
	}
	// An mm identifier containing ':' splits from the right, and changes only overlapping blocks.
	rc, withMM, errs := runCmd(t, runHash, "", append(base, "--tokens", "1,2,3,4,5,6,7,8", "--mm", "L:abc:4:2")...)
	if rc != 0 {
		t.Fatal(errs)
	}
	m := parseHashOut(t, withMM)
	if m.Blocks[0].HashHex != h.Blocks[0].HashHex || m.Blocks[1].HashHex == h.Blocks[1].HashHex {
		t.Errorf("mm item at 4..6 should change block 1 only:\n%s\n%s", fromFlag, withMM)
	}
}

func TestHashBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		rc   int
		msg  string
	}{
		{[]string{"--algo", "md5", "--tokens", "1"}, 1, "unknown hash algorithm"},
		{[]string{"--tokens", "1,x"}, 1, `token 1 "x"`},
		{[]string{"--tokens", "4294967296"}, 1, "not a token id"},
		{[]string{}, 1, "exactly one of --tokens and --tokens-file"},
		{[]string{"--block-size", "0", "--tokens", "1"}, 1, "--block-size 0"},
		{[]string{"--tokens", "1", "--mm", "img:3"}, 2, "ID:OFFSET:LENGTH"},
		{[]string{"--tokens", "1", "--mm", "a:0:4", "--mm", "b:2:4"}, 1, "overlap"},
		{[]string{"--tokens-file", "/nonexistent/x"}, 1, "no such file"},
		{[]string{"--nope"}, 2, "flag provided but not defined"},
	} {
		rc, out, errs := runCmd(t, runHash, "", c.args...)
		if rc != c.rc || !strings.Contains(errs, c.msg) || out != "" {
			t.Errorf("%v: rc %d (want %d), stderr %q (want %q), stdout %q", c.args, rc, c.rc, errs, c.msg, out)
		}
	}
}

func strconvU(v uint32) string { return strconv.FormatUint(uint64(v), 10) }
