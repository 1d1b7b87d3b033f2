package render

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/internal/engineflags"
)

// SGLang's server as the operator renders it, read from sgl-project/sglang:
//   - python/sglang/srt/server_args.py at commit 001067fffe33 (ServerArgs: one flag per field,
//     dashes for underscores; --model-path, --served-model-name, --host (default 127.0.0.1, so
//     the operator binds every interface), --port, --tp-size, --dp-size, --page-size,
//     --kv-events-config, --disable-radix-cache (prefix caching is on without it),
//     --enable-metrics, --enable-cache-report (cached_tokens in usage.prompt_tokens_details),
//     --revision, --enable-lora, --lora-paths NAME=PATH);
//   - python/sglang/srt/disaggregation/kv_events.py at commit 006d053f182f (KVEventsConfig:
//     publisher, endpoint, replay_endpoint, buffer_steps, hwm, max_queue_size, topic; the PUB
//     socket binds an endpoint with "*" and connects to one with a host; each DP rank offsets
//     both endpoints' ports by its rank), and the unit test of the same file at commit
//     7b814519a9ea (pure data parallelism offsets by the DP rank, attention DP by the
//     attention-DP rank: rank r publishes on base+r either way).
//
//
// The config turns publishing on with enable_kv_cache_events true: kv_events.py at 612d579090db
// (newer than the commits above) creates the ZMQ publisher only when that key is true, and the
// older KVEventsConfig (a plain pydantic BaseModel, extra keys ignored) drops it, so one config
// publishes on both. Otherwise it carries only the keys the publisher takes.

// TestedSGLangReleases are the lmsysorg/sglang tags kvroute is tested with, newest first; the
// first is the default image of kind sglang. "Tested" means what TestedVLLMReleases means:
// the flags the operator writes and the event wire are covered by this repository's renderer,
// decoders and simulator; no SGLang runs in CI. The source index held main-branch snapshots,
// not the tree at the tag, so the flags above are the snapshot's.
var TestedSGLangReleases = []string{"v0.5.19"}

// sglangFlagTable checks spec.engine.args against SGLang's options (internal/engineflags).
var sglangFlagTable = newFlagTable(flagTable{
	of: "`python3 -m sglang.launch_server` of SGLang " + TestedSGLangReleases[0], long: engineflags.SGLang,
})

// SGLangImage is the image repository of SGLang's releases.
const SGLangImage = "lmsysorg/sglang"

// sglangServer renders `python3 -m sglang.launch_server`.
type sglangServer struct{}

func (sglangServer) command() []string {
	return []string{"python3", "-m", "sglang.launch_server"}
}
func (sglangServer) env(*v1alpha1.KVRoutedModel) ([]corev1.EnvVar, error) { return nil, nil }
func (sglangServer) configFile(*v1alpha1.KVRoutedModel) (*engineConfigFile, error) {
	return nil, nil
}
func (sglangServer) healthPath() string  { return "/health" }
func (sglangServer) metricsPath() string { return "/metrics" }
func (sglangServer) flags() *flagTable   { return sglangFlagTable }
func (sglangServer) releases() engineReleases {
	return engineReleases{Engine: "SGLang", Repo: SGLangImage, Tags: TestedSGLangReleases}
}

func (sglangServer) args(m *v1alpha1.KVRoutedModel) ([]string, error) {
	e := &m.Spec.Engine
	model, err := TranslateURI(m.Spec.Model.URI)
	if err != nil {
		return nil, err
	}
	args := []string{
		"--model-path", model.Path,
		"--served-model-name", m.Spec.Model.Name,
		"--host", "0.0.0.0",
		"--port", itoa(e.Port),
		"--tp-size", itoa(e.Parallelism.Tensor),
		"--dp-size", itoa(e.Parallelism.DataLocal),
		"--page-size", itoa(e.BlockSize),
		"--enable-metrics",
		"--enable-cache-report",
	}
	if model.Revision != "" {
		args = append(args, "--revision", model.Revision)
	}
	if e.APIKeySecretRef != nil {
		// SGLang takes its key only as --api-key: server_args.py at 001067fffe33 has no
		// variable for it (vLLM's VLLM_API_KEY has no SGLang counterpart). The kubelet expands
		// $(VAR) from the Secret-backed variable engineEnv sets, so the pod spec shows only
		// the reference; the process's arguments on the node hold the key.
		args = append(args, "--api-key", "$("+EngineAPIKeyEnv+")")
	}
	if *e.KVEvents.Enabled {
		cfg, err := publisherConfigJSON(m, true)
		if err != nil {
			return nil, err
		}
		args = append(args, "--kv-events-config", cfg)
	}
	lora, err := loraArgs(m, "SGLang", "--lora-paths")
	if err != nil {
		return nil, err
	}
	return withUserArgs(append(args, lora...), m), nil
}
