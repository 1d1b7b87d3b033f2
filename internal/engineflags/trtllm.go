package engineflags

// TRTLLM are the options of `trtllm-serve` (the serve command), as click registers them in
// tensorrt_llm/commands/serve.py of NVIDIA/TensorRT-LLM at commit 00209af149e7: underscores as
// declared, each alias its own entry, no --no- forms (its flags are is_flag switches). Re-read
// the file at the tag when render.TestedTRTLLMReleases[0] moves.
var TRTLLM = map[string]bool{
	"tokenizer": false, "custom_tokenizer": false, "host": false, "port": false,
	"backend": false, "custom_module_dirs": false, "log_level": false,
	"max_beam_width": false, "max_batch_size": false, "max_num_tokens": false,
	"max_seq_len": false, "tensor_parallel_size": false, "tp_size": false,
	"pipeline_parallel_size": false, "pp_size": false, "context_parallel_size": false,
	"cp_size": false, "moe_expert_parallel_size": false, "ep_size": false,
	"moe_cluster_parallel_size": false, "cluster_size": false, "gpus_per_node": false,
	"free_gpu_memory_fraction": false, "kv_cache_free_gpu_memory_fraction": false,
	"num_postprocess_workers": false, "trust_remote_code": false, "revision": false,
	"config": false, "extra_llm_api_options": false, "reasoning_parser": false,
	"tool_parser": false, "metadata_server_config_file": false, "server_role": false,
	"fail_fast_on_attention_window_too_large": false, "otlp_traces_endpoint": false,
	"disagg_cluster_uri": false, "enable_chunked_prefill": false, "media_io_kwargs": false,
	"chat_template": false,
}
