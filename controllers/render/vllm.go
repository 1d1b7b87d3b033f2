package render

import (
	"strings"

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
	name, _, _ := strings.Cut(image, "@")
	repo, t := name, ""
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		repo, t = name[:i], name[i+1:]
	}
	for _, s := range simImages {
		if repo == s || strings.HasSuffix(repo, "/"+s) {
			return true, t
		}
	}
	if repo != VLLMImage && !strings.HasSuffix(repo, "/"+VLLMImage) {
		return false, t
	}
	if t == "" {
		return false, ""
	}
	for _, r := range TestedVLLMReleases {
		if t == r.Tag {
			return true, t
		}
	}
	return false, t
}

// TestedVLLMTags are the tags of TestedVLLMReleases, for messages.
func TestedVLLMTags() []string { return vllmrelease.Tags() }
