package render

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

// Version is this release of kvroute: the tag of its images (ghcr.io/kvroute/...), of
// dist/install.yaml's manager and of the OLM bundle. test/ship keeps them in step with it and
// with the release workflow.
const Version = "v0.1.0"

// TestedVLLM is one vLLM release the project's tests and vectors cover.
type TestedVLLM struct {
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

// TestedVLLMReleases are the vLLM releases kvroute is tested with, newest first. The first is
// the default engine image. "Tested" means: the release's event shape, replay framing,
// engine flags the operator writes and the metrics the router and autoscaler read are covered
// by this repository's decoders, vectors and simulator (vllm-sim --event-layout map sends E3);
// no vLLM runs in CI. docs/install.md lists the same table; test/ship checks they agree.
var TestedVLLMReleases = []TestedVLLM{
	{
		Tag:        "v0.26.0",
		EventShape: "E3: array batch of map events",
		Replay:     "`[\"\", topic, seq, payload]`; end `[\"\", \"\", ff*8, \"\"]`",
		Evidence:   "live capture (testdata/vllm/vllm-batch-shapes.json E3); kvwire vectors for E1, E2, E3",
	},
}

// VLLMImage is the image repository the tested releases are published under.
const VLLMImage = "vllm/vllm-openai"

// Images the operator uses when neither the resource nor a flag names one, and that
// `kvroutectl render` uses by default: the newest tested vLLM, and this release's kvrouter.
var (
	DefaultEngineImage = VLLMImage + ":" + TestedVLLMReleases[0].Tag
	DefaultRouterImage = "ghcr.io/kvroute/kvrouter:" + Version
)

// simImages are engine images that are not vLLM but speak what the tests cover (kvroute's own
// simulator), so they are not "untested".
var simImages = []string{"ghcr.io/kvroute/vllm-sim", "kvroute/vllm-sim"}

// EngineImageTested reports whether image is a tested vLLM release (any registry host in front
// of vllm/vllm-openai, e.g. docker.io/), or kvroute's vllm-sim. It returns the tag it found, ""
// for an image with no tag (or only a digest, which cannot be mapped to a release).
func EngineImageTested(image string) (tested bool, tag string) {
	return EngineImageTestedFor(v1alpha1.EngineVLLM, image)
}

// TestedVLLMTags are the tags of TestedVLLMReleases, for messages.
func TestedVLLMTags() []string {
	out := make([]string, len(TestedVLLMReleases))
	for i, r := range TestedVLLMReleases {
		out[i] = r.Tag
	}
	return out
}

// vllmServer renders `vllm serve`.
type vllmServer struct{}

func (vllmServer) command() []string                                    { return []string{"vllm", "serve"} }
func (vllmServer) args(m *v1alpha1.KVRoutedModel) ([]string, error)     { return vllmArgs(m) }
func (vllmServer) env(*v1alpha1.KVRoutedModel) ([]corev1.EnvVar, error) { return nil, nil }
func (vllmServer) healthPath() string                                   { return "/health" }
func (vllmServer) metricsPath() string                                  { return "/metrics" }
func (vllmServer) flags() *flagTable                                    { return vllmFlagTable }
func (vllmServer) releases() engineReleases {
	return engineReleases{Engine: "vLLM", Repo: VLLMImage, Tags: TestedVLLMTags()}
}
