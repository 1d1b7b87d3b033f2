// Package vllmrelease is the vLLM release kvroute is pinned to and what it was checked against:
// the tested releases (newest first, the first is the default engine image), the options of
// its `vllm serve` with their arities, and its KV-events bind/connect rule. The operator's
// engine-argument check, its renderer and vllm-sim's `vllm serve` all read this one package,
// so a move of the pin moves them together.
package vllmrelease

import "strings"

// Release is one vLLM release the project's tests and vectors cover.
type Release struct {
	// Tag of vllm/vllm-openai.
	Tag string
	// EventShape is the KV-event batch shape it sends (testdata/vllm/vllm-batch-shapes.json):
	// E1 array batch of array events, E2 map batch of map events, E3 array batch of map events.
	EventShape string
	// Replay is its replay reply framing.
	Replay string
	// Evidence says what the claim rests on.
	Evidence string
}

// Image is the image repository the tested releases are published under.
const Image = "vllm/vllm-openai"

// Tested are the vLLM releases kvroute is tested with, newest first; the first is the default
// engine image. "Tested" means: the release's event shape, replay framing, engine flags the
// operator writes, the metrics the router and autoscaler read and the HTTP endpoints the router
// serves are covered by this repository's decoders, vectors and simulator; no vLLM runs in CI.
// docs/install.md lists the same table; test/ship checks they agree.
//
// v0.31.0 was read from untagged snapshots: the source index holds vllm-project/vllm files by
// commit, with no tree tagged v0.31.0 (nor v0.26.0). What the row claims rests on the files and
// commits named in Sources.
var Tested = []Release{
	{
		Tag:        "v0.31.0",
		EventShape: "E3: array batch of map events; optional `locality`, `ownership`, `session_id`; media GPU, CPU, FS/OBJ/STORAGE",
		Replay:     "seq 8 bytes, or 24 (seq + publisher id) with `snapshot_endpoint`; heartbeats (empty batches) then",
		Evidence:   "kv_events contract test and docs read at untagged commits (no tagged tree indexed); kvwire vectors for E1, E2, E3 and the 2026 contract",
	},
	{
		Tag:        "v0.26.0",
		EventShape: "E3: array batch of map events",
		Replay:     "`[\"\", topic, seq, payload]`; end `[\"\", \"\", ff*8, \"\"]`",
		Evidence:   "live capture (testdata/vllm/vllm-batch-shapes.json E3); kvwire vectors for E1, E2, E3",
	},
}

// Source is one vLLM file read for the pin, at the commit the source index holds.
type Source struct {
	Path, Commit, What string
}

// Sources are the vLLM files the pin was checked against. None is a tagged tree: each is the
// snapshot the index holds, so a change between it and the tag is not seen here.
var Sources = []Source{
	{"vllm/engine/arg_utils.py", "99d7eb5d6a51", "EngineArgs options (and a later, unrecorded snapshot's additions)"},
	{"vllm/entrypoints/openai/cli_args.py", "789340fbad95", "FrontendArgs options"},
	{"tests/v1/core/test_kv_events_contract.py", "a0db8d8a0eb8", "residency copies, locality, ownership, session_id"},
	{"docs/features/kv_events.md", "0aa3ce853c7d", "24-byte sequence frames, snapshot endpoint, heartbeats"},
	{"vllm/entrypoints/openai/api_server.py", "048027fbbdb8", "routes registered; HTTPException and validation error types"},
	{"vllm/entrypoints/openai/engine/serving.py", "619e4b31da77", "create_error_response's types (BadRequestError, NotFoundError, InternalServerError, NotImplementedError)"},
	{"vllm/entrypoints/openai/engine/protocol.py", "d7e52523a55c", "ErrorResponse / ErrorInfo"},
	{"vllm/entrypoints/openai/responses/api_router.py", "f6e93254b870", "POST /v1/responses, GET /v1/responses/{id}, POST /v1/responses/{id}/cancel"},
	{"vllm/entrypoints/openai/responses/serving.py", "4d89a999c51e", "in-memory store, previous_response_id lookup, 404 for an unknown id"},
	{"vllm/entrypoints/openai/responses/utils.py", "d0ac57910c16", "instructions and input as chat messages"},
	{"vllm/entrypoints/anthropic/api_router.py", "42fa4c096d40", "POST /v1/messages and its error shape"},
	{"vllm/entrypoints/anthropic/protocol.py", "82df3f491008", "Messages request, usage and stream events"},
	{"vllm/entrypoints/pooling/scoring/api_router.py", "facb56e2eb7d", "/score, /v1/score, /rerank, /v1/rerank, /v2/rerank"},
}

// DefaultImage is the newest tested release's image.
func DefaultImage() string { return Image + ":" + Tested[0].Tag }

// Tags are the tags of Tested, for messages.
func Tags() []string {
	out := make([]string, len(Tested))
	for i, r := range Tested {
		out[i] = r.Tag
	}
	return out
}

// BindsEndpoint reports whether vLLM binds its KV-events PUB socket to endpoint rather than
// connecting to it: a wildcard host ("*", "::") or a local transport binds, a named host
// connects (vllm/distributed/kv_events.py).
func BindsEndpoint(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}
