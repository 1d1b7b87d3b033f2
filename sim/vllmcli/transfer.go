package vllmcli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/sim/vllmsim"
)

// kvTransfer is vLLM's KVTransferConfig (vllm/config/kv_transfer.py) as --kv-transfer-config
// gives it: every field vLLM has is accepted, the simulator reads the connector, the role,
// the engine id and the load-failure policy.
type kvTransfer struct {
	Connector           *string         `json:"kv_connector"`
	EngineID            *string         `json:"engine_id"`
	BufferDevice        *string         `json:"kv_buffer_device"`
	BufferSize          *float64        `json:"kv_buffer_size"`
	Role                *string         `json:"kv_role"`
	Rank                *int            `json:"kv_rank"`
	ParallelSize        *int            `json:"kv_parallel_size"`
	IP                  *string         `json:"kv_ip"`
	Port                json.RawMessage `json:"kv_port"`
	ExtraConfig         json.RawMessage `json:"kv_connector_extra_config"`
	ModulePath          *string         `json:"kv_connector_module_path"`
	EnablePermuteLocal  *bool           `json:"enable_permute_local_kv"`
	LoadFailurePolicy   *string         `json:"kv_load_failure_policy"`
	EnableKVCacheEvents *bool           `json:"enable_kv_cache_events"`
}

// NIXL's side channel and abort timeout come from the environment (vllm/envs.py).
const (
	sideChannelHostEnv = "VLLM_NIXL_SIDE_CHANNEL_HOST"
	sideChannelPortEnv = "VLLM_NIXL_SIDE_CHANNEL_PORT"
	abortTimeoutEnv    = "VLLM_NIXL_ABORT_REQUEST_TIMEOUT"
)

// ApplyKVTransfer is applyKVTransfer for the simulator's own --kv-transfer-config flag (a
// disaggregated kvbench replay starts its engines with the simulator's flags, not vLLM's).
func ApplyKVTransfer(cfg *vllmsim.Config, raw string, env func(string) (string, bool)) error {
	return applyKVTransfer(cfg, raw, env)
}

// applyKVTransfer sets the simulated connector from --kv-transfer-config and the NIXL
// environment (side channel localhost:5600 and a 480 s abort timeout when unset, vLLM's
// defaults).
func applyKVTransfer(cfg *vllmsim.Config, raw string, env func(string) (string, bool)) error {
	var kc kvTransfer
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&kc); err != nil {
		return fmt.Errorf("--kv-transfer-config: %v", err)
	}
	if kc.Connector == nil || *kc.Connector == "" {
		return nil // no connector: vLLM runs without KV transfer
	}
	kt := &vllmsim.KVTransfer{Connector: *kc.Connector, SideChannelHost: "localhost", SideChannelPort: 5600}
	if kc.Role != nil {
		kt.Role = *kc.Role
	}
	if kc.EngineID != nil {
		kt.EngineID = *kc.EngineID
	}
	if kc.LoadFailurePolicy != nil {
		kt.LoadFailurePolicy = *kc.LoadFailurePolicy
	}
	if v, ok := env(sideChannelHostEnv); ok && v != "" {
		kt.SideChannelHost = v
	}
	if v, ok := env(sideChannelPortEnv); ok && v != "" {
		port, err := strconv.Atoi(v)
		if err != nil || port < 1 || port > 65535 {
			return fmt.Errorf("%s=%q: want a port 1..65535", sideChannelPortEnv, v)
		}
		kt.SideChannelPort = port
	}
	if v, ok := env(abortTimeoutEnv); ok && v != "" {
		secs, err := strconv.Atoi(v)
		if err != nil || secs < 1 {
			return fmt.Errorf("%s=%q: want whole seconds, at least 1", abortTimeoutEnv, v)
		}
		kt.AbortTimeout = time.Duration(secs) * time.Second
	}
	cfg.KVTransfer = kt
	if err := (vllmsim.Config{KVTransfer: kt}).Defaults().Validate(); err != nil {
		return fmt.Errorf("--kv-transfer-config: %v", err)
	}
	return nil
}
