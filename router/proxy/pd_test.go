package proxy

import (
	"bufio"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/sim/vllmsim"
)

// The two legs against vllm-sim in both roles: the prefill leg's answer carries the parameters
// the decode leg needs, and the streamed decode leg finds the prompt's blocks pulled from the
// prefill engine (cached_tokens: all but the last prompt token, as vLLM reports a remote
// prefill).
func TestPrefillDecodeLegsAgainstTheSim(t *testing.T) {
	p := startPinnedSim(t, vllmsim.Config{KVTransfer: &vllmsim.KVTransfer{Connector: "NixlConnector", Role: "kv_both"}})
	d := startPinnedSim(t, vllmsim.Config{KVTransfer: &vllmsim.KVTransfer{Connector: "NixlConnector", Role: "kv_both"}})
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = "7" + strings.Repeat("1", i%3)
	}
	client := `{"model":"vllm-sim","prompt":[` + strings.Join(ids, ",") + `],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`

	pre, err := PrefillLeg([]byte(client))
	if err != nil {
		t.Fatal(err)
	}
	var pm map[string]any
	_ = json.Unmarshal(pre, &pm)
	if pm["stream"] != false || pm["max_tokens"] != float64(1) || pm["stream_options"] != nil || pm["model"] != "vllm-sim" {
		t.Fatalf("prefill leg %s", pre)
	}
	answer := post(t, p.URL()+"/v1/completions", string(pre))
	params, err := TransferParams(answer)
	if err != nil {
		t.Fatalf("%v: %s", err, answer)
	}
	dec, err := DecodeLeg([]byte(client), params)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(d.URL()+"/v1/completions", "application/json", strings.NewReader(string(dec)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("decode leg: %d", resp.StatusCode)
	}
	var cached, completion int = -1, -1
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var ch struct {
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
				Details          *struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(line), &ch) == nil && ch.Usage != nil && ch.Usage.Details != nil {
			cached, completion = ch.Usage.Details.Cached, ch.Usage.CompletionTokens
		}
	}
	if cached != 99 || completion != 5 {
		t.Fatalf("decode leg usage: cached %d completion %d, want 99 (pulled from the prefill engine) and 5", cached, completion)
	}
}

func TestLegBodiesRefuseWhatIsNotAnObject(t *testing.T) {
	if _, err := PrefillLeg([]byte(`[1]`)); err == nil {
		t.Error("PrefillLeg took an array")
	}
	if _, err := TransferParams([]byte(`{"choices":[]}`)); !errors.Is(err, ErrNoTransferParams) {
		t.Errorf("an answer without kv_transfer_params: %v", err)
	}
	b, _ := PrefillLeg([]byte(`{"messages":[],"max_completion_tokens":9}`))
	if !strings.Contains(string(b), `"max_completion_tokens":1`) {
		t.Errorf("chat prefill leg %s", b)
	}
}
