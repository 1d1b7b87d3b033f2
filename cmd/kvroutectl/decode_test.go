package main

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDecodeEveryVectorPayload(t *testing.T) {
	v := loadCLIVectors(t)
	n := 0
	for set, msgs := range v.KVEvents.Sets {
		for _, m := range msgs {
			rc, out, errs := runCmd(t, runDecode, "", "--hex", m.Frames["payload"])
			if rc != 0 {
				t.Fatalf("%s/%s: rc %d: %s", set, m.Label, rc, errs)
			}
			dec := json.NewDecoder(strings.NewReader(out))
			dec.UseNumber()
			var got struct {
				TS     json.Number      `json:"ts"`
				Rank   *json.Number     `json:"data_parallel_rank"`
				Events []map[string]any `json:"events"`
			}
			if err := dec.Decode(&got); err != nil {
				t.Fatalf("%s: %v", out, err)
			}
			if got.TS != "1767225600.25" || got.Rank == nil || *got.Rank != "0" || len(got.Events) == 0 {
				t.Errorf("%s/%s: %s", set, m.Label, out)
			}
			if m.Label == "seq0_BlockStored_A" {
				e := got.Events[0]
				hashes := e["block_hashes"].([]any)
				first := hashes[0]
				if strings.Contains(set, "int_hashes") {
					// The sha256 wire int of A's block 0, from the same vectors file.
					want := v.Sequences["A_0_to_63"].Algos["sha256"][0].WireInt
					if first != want {
						t.Errorf("%s: first hash %v (%T), want the number %s", set, first, first, want)
					}
				} else if first != v.Sequences["A_0_to_63"].Algos["sha256"][0].HashHex {
					t.Errorf("%s: first hash %v, want lowercase hex", set, first)
				}
				if e["type"] != "BlockStored" || e["parent_block_hash"] != nil || e["medium"] != "GPU" || e["group_idx"] != json.Number("0") {
					t.Errorf("%s: event %v", set, e)
				}
				if _, ok := e["kv_cache_spec_sliding_window"]; ok && strings.HasPrefix(set, "map") {
					t.Errorf("%s: field the event does not carry was printed", set)
				}
			}
			n++
		}
	}
	if n != 16 {
		t.Fatalf("decoded %d payloads, want 16", n)
	}
}

func TestDecodeFileAndStdin(t *testing.T) {
	v := loadCLIVectors(t)
	raw, _ := hex.DecodeString(v.KVEvents.Sets["map_v0.24plus__int_hashes"][2].Frames["payload"])
	file := filepath.Join(t.TempDir(), "payload.bin")
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	rc1, a, _ := runCmd(t, runDecode, "", "--file", file)
	rc2, b, _ := runCmd(t, runDecode, string(raw), "--file", "-")
	rc3, c, _ := runCmd(t, runDecode, "", "--hex", hex.EncodeToString(raw[:10])+"\n "+hex.EncodeToString(raw[10:]))
	if rc1 != 0 || rc2 != 0 || rc3 != 0 || a != b || a != c || !strings.Contains(a, `"type":"BlockRemoved"`) {
		t.Fatalf("file/stdin/hex disagree: %d %d %d\n%s\n%s\n%s", rc1, rc2, rc3, a, b, c)
	}
}

func TestDecodeBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--hex", "zz"}, "--hex: encoding/hex: invalid byte"},
		{[]string{"--hex", "93cb41"}, "kvwire: batch claims 3 items"},
		{[]string{"--hex", "92cb41da556e4010000091c0"}, "event 0: event is msgpack code 0xc0"},
		{[]string{}, "exactly one of --hex and --file"},
		{[]string{"--hex", "90", "--file", "x"}, "exactly one of --hex and --file"},
		{[]string{"--file", "/nonexistent/p"}, "no such file"},
	} {
		rc, out, errs := runCmd(t, runDecode, "", c.args...)
		if rc != 1 || !strings.Contains(errs, c.msg) || out != "" {
			t.Errorf("%v: rc %d, stderr %q (want %q), stdout %q", c.args, rc, errs, c.msg, out)
		}
	}
}

// Every batch shape decodes (the payloads vLLM's own classes wrote, see
// testdata/vllm/README.md), and the output says which shape it was.
func TestDecodeEveryBatchShape(t *testing.T) {
	raw, err := os.ReadFile("../../testdata/vllm/vllm-batch-shapes.json")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Shapes map[string]struct {
			Hex string `json:"hex"`
		} `json:"shapes"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	for _, shape := range []string{"E1", "E2", "E3"} {
		rc, out, errs := runCmd(t, runDecode, "", "--hex", f.Shapes[shape].Hex)
		if rc != 0 {
			t.Fatalf("%s: rc %d: %s", shape, rc, errs)
		}
		var got struct {
			Shape  string           `json:"shape"`
			Rank   *int             `json:"data_parallel_rank"`
			Events []map[string]any `json:"events"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("%s: %v", out, err)
		}
		if got.Shape != shape || got.Rank == nil || *got.Rank != 0 || len(got.Events) != 3 || got.Events[0]["type"] != "BlockStored" {
			t.Errorf("%s: %s", shape, out)
		}
	}
}
