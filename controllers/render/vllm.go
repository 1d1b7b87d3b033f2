package render

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/internal/vllmrelease"
)

// Version is this release of kvroute: the tag of its images (ghcr.io/kvroute/...), of
// dist/install.yaml's manager and of the OLM bundle. test/ship keeps them in step with it and
// with the release workflow.
const Version = "v0.1.0"

// TestedVLLM is one vLLM release the project's tests and vectors cover (internal/vllmrelease).
type TestedVLLM = vllmrelease.Release

// TestedVLLMReleases are the vLLM releases kvroute is tested with, newest first; the first is
// the default engine image. The list, with what each release sends and the source it was
// checked against, lives in internal/vllmrelease beside the flag table.
var TestedVLLMReleases = vllmrelease.Tested

// VLLMImage is the image repository the tested releases are published under.
const VLLMImage = vllmrelease.Image

// Images the operator uses when neither the resource nor a flag names one, and that
// `kvroutectl render` uses by default: the newest tested vLLM, and this release's kvrouter.
var (
	DefaultEngineImage = vllmrelease.DefaultImage()
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
func TestedVLLMTags() []string { return vllmrelease.Tags() }

// vllmServer renders `vllm serve`.
type vllmServer struct{}

func (vllmServer) command() []string                                    { return []string{"vllm", "serve"} }
func (vllmServer) args(m *v1alpha1.KVRoutedModel) ([]string, error)     { return vllmArgs(m) }
func (vllmServer) env(*v1alpha1.KVRoutedModel) ([]corev1.EnvVar, error) { return nil, nil }
func (vllmServer) configFile(*v1alpha1.KVRoutedModel) (*engineConfigFile, error) {
	return nil, nil
}
func (vllmServer) healthPath() string  { return "/health" }
func (vllmServer) metricsPath() string { return "/metrics" }
func (vllmServer) flags() *flagTable   { return vllmFlagTable }
func (vllmServer) releases() engineReleases {
	return engineReleases{Engine: "vLLM", Repo: VLLMImage, Tags: TestedVLLMTags()}
}

// vllmFlagTable is `vllm serve`'s options as the one pin (internal/vllmrelease) lists them.
var vllmFlagTable = newFlagTable(flagTable{
	of: "`vllm serve` of vLLM " + vllmrelease.FlagsTag, long: vllmLongFlags(), short: vllmShortFlags(),
	shortPrefixes: []string{"-O"}, underscores: true, dots: true,
})

// vllmLongFlags: each long name, true where argparse also takes --no-<name>.
func vllmLongFlags() map[string]bool {
	out := make(map[string]bool, len(vllmrelease.Flags))
	for _, f := range vllmrelease.Flags {
		out[f.Name] = f.Arity == vllmrelease.BoolOpt
	}
	return out
}

// vllmShortFlags: each single-dash alias ("-tp") with its long name.
func vllmShortFlags() map[string]string {
	out := map[string]string{}
	for _, f := range vllmrelease.Flags {
		for _, a := range f.Aliases {
			out["-"+a] = f.Name
		}
	}
	return out
}
