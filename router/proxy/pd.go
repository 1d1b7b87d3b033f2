package proxy

// The two legs of a disaggregated request in vLLM's protocol (the NIXL connector's
// kv_transfer_params; vLLM's reference proxy, tests/v1/kv_connector/nixl_integration/
// toy_proxy_server.py, send_request_to_service, sets the same fields): the prefill leg computes the prompt and
// keeps its blocks for a decoder, the decode leg pulls them and generates.

import (
	"encoding/json"
	"errors"
	"fmt"
)

// prefillParams ask the prefill engine to keep the request's blocks for a remote decoder.
var prefillParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// PrefillLeg is the client's body as the prefill leg: kv_transfer_params asking for a remote
// decode, one token (max_tokens, and max_completion_tokens where the client set it), no stream.
// The prefill engine's answer is the router's alone: the client never sees it.
func PrefillLeg(body []byte) ([]byte, error) {
	m, err := object(body)
	if err != nil {
		return nil, err
	}
	m["kv_transfer_params"] = prefillParams
	m["max_tokens"] = json.RawMessage("1")
	if _, ok := m["max_completion_tokens"]; ok {
		m["max_completion_tokens"] = json.RawMessage("1")
	}
	m["stream"] = json.RawMessage("false")
	delete(m, "stream_options")
	return json.Marshal(m)
}

// DecodeLeg is the client's body (as the router forwards it: stream and usage settings kept)
// with the prefill answer's kv_transfer_params.
func DecodeLeg(body []byte, params json.RawMessage) ([]byte, error) {
	m, err := object(body)
	if err != nil {
		return nil, err
	}
	m["kv_transfer_params"] = params
	return json.Marshal(m)
}

// ErrNoTransferParams is a prefill answer without kv_transfer_params: an engine started
// without a KV connector, or one that did not keep the blocks.
var ErrNoTransferParams = errors.New("the prefill answer carries no kv_transfer_params (is the engine started with --kv-transfer-config?)")

// TransferParams reads kv_transfer_params from a prefill leg's (non-streamed) answer.
func TransferParams(answer []byte) (json.RawMessage, error) {
	var a struct {
		P json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(answer, &a); err != nil {
		return nil, fmt.Errorf("prefill answer: %w", err)
	}
	if len(a.P) == 0 || string(a.P) == "null" {
		return nil, ErrNoTransferParams
	}
	return a.P, nil
}

func object(body []byte) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || m == nil {
		return nil, fmt.Errorf("request body is not a JSON object: %v", err)
	}
	return m, nil
}
