package render

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/internal/engineflags"
)

// TensorRT-LLM's server as the operator renders it, read from NVIDIA/TensorRT-LLM:
//   - tensorrt_llm/commands/serve.py at commit 00209af149e7 (click options, spelt with
//     underscores as declared: MODEL positional, --host (default localhost, so the operator binds
//     every interface), --port, --tp_size, --backend, --revision, --config (alias
//     --extra_llm_api_options): a YAML file whose keys override the LLM API arguments);
//   - tensorrt_llm/llmapi/llm_args.py (KvCacheConfig: enable_block_reuse, tokens_per_block,
//     event_buffer_max_size, use_kv_cache_manager_v2) and docs/source/features/kvcache.md at
//     commit 0076e9390e1e (kv_cache_config.kv_events_config: each attention-DP rank binds
//     base_port + rank for events and replay; the V2 KV cache manager publishes);
//   - tensorrt_llm/_torch/pyexecutor/kv_cache_events.py at commit 13599e98c71c (the streaming
//     publisher of PR #17023: KVEventsConfig's publisher, endpoint, replay_endpoint,
//     buffer_steps, hwm, max_queue_size, topic; the PUB socket always binds, so engines cannot
//     dial the router, and the CRD refuses EnginesConnect for this kind).
//
// The config goes in a YAML file. The operator puts it in the pod annotation
// AnnotationEngineConfig and the kubelet projects that annotation read-only into the container
// through a downward API volume, so no shell writes it and the image needs none (vllm-sim's
// hermetic image has no /bin/sh); a change to it changes the pod template and rolls the pods,
// as a change to the args does. A downward API file cannot carry the pod's IP (status.podIP
// is an environment-only field), so the config, shared by every pod, publishes the topic
// <prefix>@<engine Deployment>@<model>, and the pods carry it in AnnotationKVTopic for the
// router's discovery. The router dials each pod's own event port (the publisher always binds),
// so the topic need not tell pods apart.

// TestedTRTLLMReleases are the nvcr.io/nvidia/tensorrt-llm/release tags kvroute is tested
// with, newest first; the first is the default image of kind trtllm. "Tested" as for
// TestedVLLMReleases: no TensorRT-LLM runs in CI. The streaming KV-event publisher merged on
// 2026-07-29 (PR #17023), after 1.3.0rc21; the source index held no tree tagged with a
// release, so this tag is the first pre-release cut after the merge, not read at its tag.
var TestedTRTLLMReleases = []string{"1.3.0rc22"}

// trtllmFlagTable checks spec.engine.args against trtllm-serve's options (internal/engineflags).
var trtllmFlagTable = newFlagTable(flagTable{
	of: "`trtllm-serve` of TensorRT-LLM " + TestedTRTLLMReleases[0], long: engineflags.TRTLLM,
})

// TRTLLMImage is the image repository of TensorRT-LLM's releases.
const TRTLLMImage = "nvcr.io/nvidia/tensorrt-llm/release"

// TRTLLMConfigPath is where trtllm-serve reads its --config YAML: the file the kubelet
// projects from the pod annotation AnnotationEngineConfig.
const (
	trtllmConfigDir  = "/etc/kvroute/trtllm"
	trtllmConfigFile = "config.yaml"
	TRTLLMConfigPath = trtllmConfigDir + "/" + trtllmConfigFile
)

// trtllmServer renders `trtllm-serve`.
type trtllmServer struct{}

// command is trtllm-serve itself: its config is a file the kubelet writes (configFile), so no
// shell runs before it.
func (trtllmServer) command() []string  { return []string{"trtllm-serve"} }
func (trtllmServer) healthPath() string { return "/health" }

// metricsPath: trtllm-serve's /metrics answers JSON iteration statistics; Prometheus text is
// under /prometheus/metrics.
func (trtllmServer) metricsPath() string { return "/prometheus/metrics" }
func (trtllmServer) flags() *flagTable   { return trtllmFlagTable }
func (trtllmServer) releases() engineReleases {
	return engineReleases{Engine: "TensorRT-LLM", Repo: TRTLLMImage, Tags: TestedTRTLLMReleases}
}

// trtllmTensor is --tp_size: with several DP ranks in the pod they are attention-DP ranks, one
// GPU each (the CRD keeps tensor at 1 then), so the world is the DP size.
func trtllmTensor(m *v1alpha1.KVRoutedModel) int32 {
	p := m.Spec.Engine.Parallelism
	if p.DataLocal > 1 {
		return p.DataLocal
	}
	return p.Tensor
}

func (trtllmServer) args(m *v1alpha1.KVRoutedModel) ([]string, error) {
	e := &m.Spec.Engine
	model, err := TranslateURI(m.Spec.Model.URI)
	if err != nil {
		return nil, err
	}
	args := []string{
		model.Path,
		"--host", "0.0.0.0",
		"--port", itoa(e.Port),
		"--tp_size", itoa(trtllmTensor(m)),
		"--backend", "pytorch",
	}
	if model.Revision != "" {
		args = append(args, "--revision", model.Revision)
	}
	return withUserArgs(append(args, "--config", TRTLLMConfigPath), m), nil
}

// trtllmConfig is the part of the LLM API arguments the operator owns.
type trtllmConfig struct {
	EnableAttentionDP bool                `json:"enable_attention_dp,omitempty"`
	KVCache           trtllmKVCacheConfig `json:"kv_cache_config"`
}

type trtllmKVCacheConfig struct {
	EnableBlockReuse   bool             `json:"enable_block_reuse"`
	TokensPerBlock     int32            `json:"tokens_per_block"`
	UseManagerV2       bool             `json:"use_kv_cache_manager_v2"`
	EventBufferMaxSize int32            `json:"event_buffer_max_size,omitempty"`
	KVEvents           *publisherConfig `json:"kv_events_config,omitempty"`
}

// TRTLLMConfigJSON is the config trtllm-serve reads: block reuse (its prefix cache) on, the
// block size, and with events on the V2 KV cache manager and its ZMQ publisher.
func TRTLLMConfigJSON(m *v1alpha1.KVRoutedModel) (string, error) {
	e := &m.Spec.Engine
	c := trtllmConfig{
		EnableAttentionDP: e.Parallelism.DataLocal > 1,
		KVCache:           trtllmKVCacheConfig{EnableBlockReuse: true, TokensPerBlock: e.BlockSize},
	}
	if *e.KVEvents.Enabled {
		pc := newPublisherConfig(m, true)
		pc.Topic = TRTLLMTopic(m)
		c.KVCache.UseManagerV2 = true
		c.KVCache.EventBufferMaxSize = e.KVEvents.BufferSteps
		c.KVCache.KVEvents = &pc
	}
	return compactJSON(c)
}

// TRTLLMTopic is the KV-event topic every pod of the model publishes (see above), "" with
// events off.
func TRTLLMTopic(m *v1alpha1.KVRoutedModel) string {
	ev := m.Spec.Engine.KVEvents
	if EngineKind(m) != v1alpha1.EngineTRTLLM || ev.Enabled == nil || !*ev.Enabled {
		return ""
	}
	return ev.TopicPrefix + "@" + EngineName(m) + "@" + m.Spec.Model.Name
}

func (trtllmServer) env(*v1alpha1.KVRoutedModel) ([]corev1.EnvVar, error) { return nil, nil }

func (trtllmServer) configFile(m *v1alpha1.KVRoutedModel) (*engineConfigFile, error) {
	cfg, err := TRTLLMConfigJSON(m)
	if err != nil {
		return nil, err
	}
	return &engineConfigFile{Dir: trtllmConfigDir, Name: trtllmConfigFile, Content: cfg}, nil
}
